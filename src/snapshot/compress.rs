//! Streaming compression and decompression in push style: bytes go in as they arrive from etcd or
//! from the store, compressed (or plain) bytes are taken out as they are produced. Nothing holds
//! more than the codec's window plus what the caller has not taken yet.

use std::io::{self, Write};

use crate::store::crypt::{Keys, Opener, Sealer};
use crate::store::layout::{Compression, Encryption};

/// zstd level: 3 is zstd's default, fast enough to keep up with etcd's snapshot stream on one core.
pub const ZSTD_LEVEL: i32 = 1;

pub enum Compressor {
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    None(Vec<u8>),
}

impl Compressor {
    pub fn new(c: Compression) -> io::Result<Self> {
        Ok(match c {
            Compression::Zstd => {
                let mut e = zstd::stream::write::Encoder::new(Vec::new(), ZSTD_LEVEL)?;
                e.include_checksum(true)?;
                Self::Zstd(e)
            }
            Compression::Gzip => Self::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::fast(),
            )),
            Compression::None => Self::None(Vec::new()),
        })
    }

    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Self::Zstd(e) => e.write_all(data),
            Self::Gzip(e) => e.write_all(data),
            Self::None(v) => {
                v.extend_from_slice(data);
                Ok(())
            }
        }
    }

    /// Output produced so far.
    pub fn take(&mut self) -> Vec<u8> {
        match self {
            Self::Zstd(e) => std::mem::take(e.get_mut()),
            Self::Gzip(e) => std::mem::take(e.get_mut()),
            Self::None(v) => std::mem::take(v),
        }
    }

    /// Ends the stream; returns the remaining output.
    pub fn finish(self) -> io::Result<Vec<u8>> {
        match self {
            Self::Zstd(e) => e.finish(),
            Self::Gzip(e) => e.finish(),
            Self::None(v) => Ok(v),
        }
    }
}

/// Compression, then (with recipients) age encryption: what goes into an object's payload.
pub struct Packer {
    comp: Compressor,
    seal: Option<Sealer>,
}

impl Packer {
    pub fn new(c: Compression, keys: &Keys) -> io::Result<Self> {
        let seal = if keys.encrypts() {
            Some(Sealer::new(&keys.recipients)?)
        } else {
            None
        };
        Ok(Self {
            comp: Compressor::new(c)?,
            seal,
        })
    }

    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.comp.write(data)?;
        if let Some(s) = self.seal.as_mut() {
            s.write(&self.comp.take())?;
        }
        Ok(())
    }

    pub fn take(&mut self) -> Vec<u8> {
        match self.seal.as_mut() {
            Some(s) => s.take(),
            None => self.comp.take(),
        }
    }

    pub fn finish(self) -> io::Result<Vec<u8>> {
        let rest = self.comp.finish()?;
        match self.seal {
            Some(mut s) => {
                s.write(&rest)?;
                let mut out = s.take();
                out.extend(s.finish()?);
                Ok(out)
            }
            None => Ok(rest),
        }
    }
}

/// The reverse of [`Packer`]: decryption (for `age` payloads), then decompression.
pub struct Unpacker {
    open: Option<Opener>,
    de: Decompressor,
}

impl Unpacker {
    pub fn new(c: Compression, e: Encryption, keys: &Keys) -> io::Result<Self> {
        let open = match e {
            Encryption::Age => Some(Opener::new(keys.identities.clone())?),
            Encryption::Plain => None,
        };
        Ok(Self {
            open,
            de: Decompressor::new(c)?,
        })
    }

    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self.open.as_mut() {
            Some(o) => {
                o.write(data)?;
                self.de.write(&o.take()?)
            }
            None => self.de.write(data),
        }
    }

    pub fn take(&mut self) -> Vec<u8> {
        self.de.take()
    }

    /// See [`Decompressor::take_batch`].
    pub fn take_batch(&mut self, min: usize) -> Option<Vec<u8>> {
        self.de.take_batch(min)
    }

    pub fn finish(mut self) -> io::Result<Vec<u8>> {
        if let Some(o) = self.open.take() {
            self.de.write(&o.finish()?)?;
        }
        self.de.finish()
    }
}

impl From<Decompressor> for Unpacker {
    /// A plain payload in another program's compression (GBR's zlib and lzw).
    fn from(de: Decompressor) -> Self {
        Self { open: None, de }
    }
}

pub enum Decompressor {
    Zstd(zstd::stream::write::Decoder<'static, Vec<u8>>),
    Gzip(flate2::write::GzDecoder<Vec<u8>>),
    /// Read only: GBR's `zlib` policy (Go's compress/zlib).
    Zlib(flate2::write::ZlibDecoder<Vec<u8>>),
    /// Read only: GBR's `lzw` policy (Go's compress/lzw, LSB first, 8-bit literals).
    Lzw(Box<LzwStream>),
    None(Vec<u8>),
}

/// An LZW code stream decoded as it arrives; it must end with its end code.
pub struct LzwStream {
    de: weezl::decode::Decoder,
    out: Vec<u8>,
    done: bool,
}

impl LzwStream {
    fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        let mut buf = [0u8; 16 << 10];
        while !data.is_empty() {
            if self.done {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "data after the lzw end code",
                ));
            }
            let r = self.de.decode_bytes(data, &mut buf);
            self.out.extend_from_slice(&buf[..r.consumed_out]);
            data = &data[r.consumed_in..];
            match r.status {
                Ok(weezl::LzwStatus::Done) => self.done = true,
                Ok(weezl::LzwStatus::Ok) => {}
                Ok(weezl::LzwStatus::NoProgress) => break,
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            }
        }
        Ok(())
    }
}

impl Decompressor {
    pub fn new(c: Compression) -> io::Result<Self> {
        Ok(match c {
            Compression::Zstd => Self::Zstd(zstd::stream::write::Decoder::new(Vec::new())?),
            Compression::Gzip => Self::Gzip(flate2::write::GzDecoder::new(Vec::new())),
            Compression::None => Self::None(Vec::new()),
        })
    }

    pub fn zlib() -> Self {
        Self::Zlib(flate2::write::ZlibDecoder::new(Vec::new()))
    }

    pub fn lzw() -> Self {
        Self::Lzw(Box::new(LzwStream {
            de: weezl::decode::Decoder::new(weezl::BitOrder::Lsb, 8),
            out: Vec::new(),
            done: false,
        }))
    }

    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Self::Zstd(d) => d.write_all(data),
            Self::Gzip(d) => d.write_all(data),
            Self::Zlib(d) => d.write_all(data),
            Self::Lzw(d) => d.write(data),
            Self::None(v) => {
                v.extend_from_slice(data);
                Ok(())
            }
        }
    }

    fn out(&mut self) -> &mut Vec<u8> {
        match self {
            Self::Zstd(d) => d.get_mut(),
            Self::Gzip(d) => d.get_mut(),
            Self::Zlib(d) => d.get_mut(),
            Self::Lzw(d) => &mut d.out,
            Self::None(v) => v,
        }
    }

    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(self.out())
    }

    /// The output produced so far once it holds at least `min` bytes; the codec goes on writing
    /// into a buffer already sized for the next batch.
    pub fn take_batch(&mut self, min: usize) -> Option<Vec<u8>> {
        let out = self.out();
        (out.len() >= min).then(|| std::mem::replace(out, Vec::with_capacity(min + min / 2)))
    }

    /// Ends the stream: fails if the compressed data stopped short of its end.
    pub fn finish(self) -> io::Result<Vec<u8>> {
        match self {
            Self::Zstd(mut d) => {
                d.flush()?;
                let out = d.into_inner();
                Ok(out)
            }
            Self::Gzip(d) => d.finish(),
            Self::Zlib(d) => d.finish(),
            Self::Lzw(d) if d.done => Ok(d.out),
            Self::Lzw(_) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the lzw stream ends before its end code",
            )),
            Self::None(v) => Ok(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's compress/lzw (GBR's lzw policy) resets its code table each time it fills: a stream
    /// that does so several times (tests/fixtures/gbr/lzw-resets.Z, made by scripts/gbr-fixture
    /// from this very text) decodes whole, in small pushes, and a cut one fails.
    #[test]
    fn go_lzw_with_table_resets_decodes_exactly() {
        let vocab = [
            "etcd",
            "revision",
            "lease",
            "/registry/pods/",
            "kube-system",
            "0",
            "1",
            "42",
            "value",
            "{\"kind\":\"Pod\"}",
            "x",
            "mod",
            "create",
            "version",
            "compact",
        ];
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut text = Vec::new();
        while text.len() < 65536 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            text.extend_from_slice(vocab[((x >> 33) % vocab.len() as u64) as usize].as_bytes());
            text.push(b' ' + ((x >> 20) % 3) as u8);
        }
        let packed = include_bytes!("../../tests/fixtures/gbr/lzw-resets.Z");
        // At most 4096 - 258 codes between resets, of 9 to 12 bits: several resets in this stream.
        assert!(
            packed.len() * 8 / 12 > 2 * 4096,
            "{} bytes: too short to reset",
            packed.len()
        );
        let mut de = Decompressor::lzw();
        let mut out = Vec::new();
        for chunk in packed.chunks(1000) {
            de.write(chunk).unwrap();
            out.extend(de.take());
        }
        out.extend(de.finish().unwrap());
        assert!(
            out == text,
            "decoded {} bytes, not the {} Go compressed",
            out.len(),
            text.len()
        );
        let mut cut = Decompressor::lzw();
        cut.write(&packed[..packed.len() / 2]).unwrap();
        assert!(cut.finish().is_err(), "a cut lzw stream must not pass for whole");
    }

    #[test]
    fn round_trip_in_small_pushes() {
        let data: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("{{\"k\":{i}}}").into_bytes())
            .collect();
        for c in [Compression::Zstd, Compression::Gzip, Compression::None] {
            let mut comp = Compressor::new(c).unwrap();
            let mut packed = Vec::new();
            for chunk in data.chunks(7777) {
                comp.write(chunk).unwrap();
                packed.extend(comp.take());
            }
            packed.extend(comp.finish().unwrap());
            if c != Compression::None {
                assert!(packed.len() < data.len() / 2, "{c:?} did not compress");
            }
            let mut de = Decompressor::new(c).unwrap();
            let mut out = Vec::new();
            for chunk in packed.chunks(999) {
                de.write(chunk).unwrap();
                out.extend(de.take());
            }
            out.extend(de.finish().unwrap());
            assert_eq!(out, data, "{c:?}");
        }
    }
}
