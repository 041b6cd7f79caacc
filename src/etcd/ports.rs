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
        let etcd = EtcdArgs::parse(&args, &HashMap::new()).unwrap();
        assert_eq!(
            taken(&etcd),
            [format!("--listen-client-urls http://127.0.0.1:{port}/")]
        );
        drop(held);
        assert!(taken(&etcd).is_empty());
    }
}
