//! The few protobuf messages the warden reads by hand (the WAL's records, an `mvccpb.KeyValue`):
//! a message as its fields, without a schema.

/// One field: (number, wire type, varint value, bytes).
pub type Field<'a> = (u64, u8, u64, &'a [u8]);

/// The fields of one message, in order; `None` when the bytes are no protobuf message.
pub fn fields(b: &[u8]) -> Option<Vec<Field<'_>>> {
    let mut out = Vec::new();
    each_field(b, |f| out.push(f))?;
    Some(out)
}

/// Calls `f` with each field of one message, in order, holding none of them; `None` when the
/// bytes are no protobuf message (after the fields before the flaw).
pub fn each_field<'a>(mut b: &'a [u8], mut f: impl FnMut(Field<'a>)) -> Option<()> {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let (num, wire) = (key >> 3, (key & 7) as u8);
        match wire {
            0 => f((num, wire, varint(&mut b)?, &[][..])),
            1 => {
                let (v, rest) = b.split_at_checked(8)?;
                b = rest;
                f((num, wire, 0, v));
            }
            2 => {
                let len = varint(&mut b)? as usize;
                let (v, rest) = b.split_at_checked(len)?;
                b = rest;
                f((num, wire, 0, v));
            }
            5 => {
                let (v, rest) = b.split_at_checked(4)?;
                b = rest;
                f((num, wire, 0, v));
            }
            _ => return None,
        }
    }
    Some(())
}
