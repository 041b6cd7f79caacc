//! The keys under a prefix now, from the live cluster: a linearizable read in pages of
//! [`PAGE`] keys, every page at the first page's revision, so the state is one consistent point.

use etcd_client::{Client, GetOptions};

use super::{Entry, Filter, State};

const PAGE: i64 = 1000;

/// The end of the range of keys that start with `prefix` (etcd's `--prefix`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every key: etcd's "\0" range end.
    vec![0]
}

/// The keys `filter` wants, and the revision they were read at.
pub async fn state_now(client: &mut Client, filter: &Filter) -> Result<(State, i64), String> {
    let end = prefix_end(&filter.prefix);
    let mut from = if filter.prefix.is_empty() {
        vec![0]
    } else {
        filter.prefix.clone()
    };
    let mut state = State::new();
    let mut revision = 0;
    loop {
        let mut opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
        if revision > 0 {
            opts = opts.with_revision(revision);
        }
        let resp = client.get(from.clone(), Some(opts)).await.map_err(|e| {
            format!(
                "read the keys under {:?}: {e}",
                String::from_utf8_lossy(&filter.prefix)
            )
        })?;
        if revision == 0 {
            revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        }
        for kv in resp.kvs() {
            let e = Entry::new(
                kv.key(),
                kv.value(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.lease(),
                false,
            );
            state.insert(kv.key().to_vec(), e);
        }
        match (resp.more(), resp.kvs().last()) {
            (true, Some(last)) => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    Ok((state, revision))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_end_of_a_prefix_is_etcds() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
