//! Nothing else may answer on etcd's addresses. An etcd started by a distribution's own unit
//! (`etcd.service`), a forgotten test member or a second warden would answer the warden's health
//! checks and take its clients' writes as if it were the warden's child, on other data. Before it
//! starts etcd, the warden binds each client and peer listen address once, as etcd is about to:
//! an address already in use is refused, naming it.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};

use url::Url;

use super::EtcdArgs;

/// The listen addresses of `etcd` that another process already holds, each as
/// `--listen-client-urls http://127.0.0.1:2379`.
pub fn taken(etcd: &EtcdArgs) -> Vec<String> {
    let mut out = Vec::new();
    for (flag, urls) in [
        ("--listen-client-urls", &etcd.listen_client_urls),
        ("--listen-peer-urls", &etcd.listen_peer_urls),
    ] {
        for url in urls {
            if addresses(url).iter().any(|a| in_use(*a)) {
                out.push(format!("{flag} {url}"));
            }
        }
    }
    out
}

/// What etcd binds for `url`: its host (a name resolved as etcd would) and port; none for unix
/// sockets.
fn addresses(url: &Url) -> Vec<SocketAddr> {
    let default_port = match url.scheme() {
        "http" | "https" => 2379,
        _ => return Vec::new(),
    };
    let host = match url.host_str() {
        Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']').to_owned(),
        _ => "0.0.0.0".to_owned(),
    };
    let port = url.port().unwrap_or(default_port);
    (host.as_str(), port)
        .to_socket_addrs()
        .map(Iterator::collect)
        .unwrap_or_default()
}

/// Another socket holds `addr`. Any other failure (an address this host does not have, a
/// privileged port) is etcd's to report.
fn in_use(addr: SocketAddr) -> bool {
    matches!(TcpListener::bind(addr), Err(e) if e.kind() == std::io::ErrorKind::AddrInUse)
}

/// Whether the etcd answering on `endpoint` (a client URL the warden talks to) is `pid` (the
/// warden's child) or one of its descendants: the listening socket's inode, from the child's own
/// view of `/proc/net/tcp{,6}`, among their open files. `Err` names the other listener; `Ok` also
/// when it cannot be told (no /proc, a unix socket, a listener in another network namespace).
pub fn answered_by_child(endpoint: &str, pid: u32) -> Result<(), String> {
    let Some(port) = Url::parse(endpoint)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .and_then(|u| u.port_or_known_default())
    else {
        return Ok(());
    };
    let inodes = listening_inodes(pid, port);
    if inodes.is_empty() {
        return Ok(());
    }
    let family = descendants(pid);
    if family.iter().any(|p| holds_any(*p, &inodes)) {
        return Ok(());
    }
    Err(format!(
        "another process (not the etcd this warden started, pid {pid}) listens on {endpoint}: its answers are not this member's; stop it"
    ))
}

/// Inodes of the sockets listening on `port`, as process `pid`'s network namespace lists them.
fn listening_inodes(pid: u32, port: u16) -> Vec<u64> {
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let local_port = f[1]
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port)
                && let Ok(inode) = f[9].parse::<u64>()
                && inode != 0
            {
                out.push(inode);
            }
        }
    }
    out
}

/// `pid` and every process below it.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            // `pid (comm) state ppid …`: comm may hold spaces and parentheses; the last ')' ends it.
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat"))
                && let Some((_, rest)) = stat.rsplit_once(')')
                && let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse::<u32>().ok())
            {
                parent_of.push((p, ppid));
            }
        }
    }
    let mut family = vec![pid];
    let mut i = 0;
    while i < family.len() {
        let parent = family[i];
        family.extend(parent_of.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    family
}

fn holds_any(pid: u32, inodes: &[u64]) -> bool {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    rd.flatten().any(|e| {
        std::fs::read_link(e.path()).is_ok_and(|l| {
            l.to_str()
                .and_then(|s| s.strip_prefix("socket:[")?.strip_suffix(']')?.parse::<u64>().ok())
                .is_some_and(|i| inodes.contains(&i))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn an_address_someone_listens_on_is_named_and_a_free_one_is_not() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let free = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let args = [
            format!("--listen-client-urls=http://127.0.0.1:{port},unix:///tmp/x.sock"),
            format!("--listen-peer-urls=http://127.0.0.1:{free}"),
        ];
        let etcd = EtcdArgs::parse(&args, &HashMap::new(), &|_| false).unwrap();
        assert_eq!(
            taken(&etcd),
            [format!("--listen-client-urls http://127.0.0.1:{port}/")]
        );
        drop(held);
        assert!(taken(&etcd).is_empty());
    }

    #[test]
    fn a_listener_of_this_process_is_its_own_and_not_another_pids() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://127.0.0.1:{}", held.local_addr().unwrap().port());
        let me = std::process::id();
        assert_eq!(answered_by_child(&url, me), Ok(()));
        // A child of this process that holds no socket: the listener is someone else's.
        let mut sleeper = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let err = answered_by_child(&url, sleeper.id()).unwrap_err();
        assert!(err.contains(&url), "{err}");
        let _ = sleeper.kill();
        #[allow(clippy::disallowed_methods, reason = "a test's own child, outside any reaper")]
        let _ = sleeper.wait();
        // Nobody listens: nothing to tell. Under `cargo test` other tests of this process fork
        // children, and one between its fork and its exec holds a copy of `held` for a moment:
        // wait until the listener is really gone before asking.
        let port = held.local_addr().unwrap().port();
        drop(held);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !listening_inodes(me, port).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the dropped listener on port {port} still listens after 5 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(answered_by_child(&url, me), Ok(()));
    }
}
