//! Real object-store emulators for the backup tests: moto's S3 server and azurite, each bound to a
//! test's own loopback address, plus a TCP proxy the test can cut to simulate a store outage.
#![allow(dead_code, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::wait_for;

/// Well-known azurite development account.
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

pub struct Emulator {
    child: Child,
    pub endpoint: String,
    pub addr: String,
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn port_open(addr: &str) -> bool {
    TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(200)).is_ok()
}

/// moto's S3 server on `ip:port`.
pub fn moto(ip: &str, port: u16) -> Emulator {
    moto_with_log(ip, port, None)
}

/// moto's S3 server, its request log (one line per HTTP request) in `log` when given.
pub fn moto_with_log(ip: &str, port: u16, log: Option<&std::path::Path>) -> Emulator {
    let addr = format!("{ip}:{port}");
    let stderr = match log {
        Some(p) => Stdio::from(std::fs::File::create(p).expect("create moto's log")),
        None => Stdio::null(),
    };
    let child = super::dies_with_test(&mut Command::new("python3"))
        .args(["-m", "moto.server", "-H", ip, "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start moto (pip install 'moto[server]')");
    let mut e = Emulator {
        child,
        endpoint: format!("http://{addr}"),
        addr: addr.clone(),
    };
    wait_for("moto's S3 server to listen", Duration::from_secs(30), || {
        if let Ok(Some(st)) = e.child.try_wait() {
            panic!("moto exited at start: {st} (is moto[server] installed?)");
        }
        port_open(&addr).then_some(())
    });
    e.endpoint = format!("http://{addr}");
    e
}

/// Creates a bucket with a plain `PUT /bucket`.
pub fn create_bucket(addr: &str, bucket: &str) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "PUT /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(
        resp.starts_with("HTTP/1.1 200") || resp.starts_with("HTTP/1.0 200"),
        "create bucket: {resp}"
    );
}

/// moto on `ip:5000` with a bucket `backups`, reached through a proxy on `ip:5001` that a test can
/// cut, hang or slow; the environment points the warden at the proxy.
pub fn moto_behind_proxy(ip: &str) -> (Emulator, Proxy, Vec<(&'static str, String)>) {
    let moto = moto(ip, 5000);
    create_bucket(&moto.addr, "backups");
    let proxy = Proxy::start(&format!("{ip}:5001"), &moto.addr);
    let env = s3_env(&format!("http://{ip}:5001"));
    (moto, proxy, env)
}

/// The environment a warden needs for `s3://` on moto: explicit endpoint and credentials, never the
/// instance metadata service.
pub fn s3_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ENDPOINT_URL", endpoint.into()),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_EC2_METADATA_DISABLED", "true".into()),
    ]
}

/// Runs `script` with boto3 against moto at `endpoint` (bound as `s3`; `argv` as sys.argv[1:]) and
/// returns what it printed.
pub fn boto3(endpoint: &str, script: &str, argv: &[&str]) -> String {
    let prelude = "import sys, json, datetime, boto3\n\
                   s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1', \
                   aws_access_key_id='testing', aws_secret_access_key='testing')\n\
                   sys.argv = sys.argv[1:]\n";
    let out = Command::new("python3")
        .arg("-c")
        .arg(format!("{prelude}{script}"))
        .arg(endpoint)
        .args(argv)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "boto3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every object key in `bucket` on the S3 server at `endpoint`, as boto3 (moto's own client)
/// lists them: what is in the store, not what the warden says it put there.
pub fn s3_keys(endpoint: &str, bucket: &str) -> Vec<String> {
    boto3(
        endpoint,
        "for page in s3.get_paginator('list_objects_v2').paginate(Bucket=sys.argv[1]):\n\
         \x20   for o in page.get('Contents', []): print(o['Key'])",
        &[bucket],
    )
    .lines()
    .map(str::to_owned)
    .collect()
}

/// azurite's blob service on `ip:port`, in memory.
pub fn azurite(ip: &str, port: u16) -> Emulator {
    let bin = std::env::var("AZURITE_BLOB").unwrap_or_else(|_| {
        format!(
            "{}/.cache/etcd-warden/azurite/node_modules/.bin/azurite-blob",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    assert!(
        std::path::Path::new(&bin).exists(),
        "azurite-blob not found at {bin} (scripts/test installs it)"
    );
    let addr = format!("{ip}:{port}");
    // In-memory persistence writes nothing to the working directory.
    let child = super::dies_with_test(&mut Command::new(&bin))
        .args([
            "--blobHost",
            ip,
            "--blobPort",
            &port.to_string(),
            "--inMemoryPersistence",
            "--disableTelemetry",
        ])
        .args(["--skipApiVersionCheck", "--loose"])
        .current_dir(std::env::temp_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start azurite");
    let mut e = Emulator {
        child,
        endpoint: format!("http://{addr}"),
        addr: addr.clone(),
    };
    wait_for("azurite to listen", Duration::from_secs(30), || {
        if let Ok(Some(st)) = e.child.try_wait() {
            panic!("azurite exited at start: {st}");
        }
        port_open(&addr).then_some(())
    });
    e
}

/// Creates a container through the azure-storage-blob package (object_store cannot).
pub fn create_container(endpoint: &str, container: &str) {
    let conn = format!(
        "DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    );
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys\nfrom azure.storage.blob import BlobServiceClient\nBlobServiceClient.from_connection_string(sys.argv[1]).create_container(sys.argv[2])",
            &conn,
            container,
        ])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "create container: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn azure_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
        ("AZURITE_BLOB_STORAGE_URL", endpoint.into()),
        ("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT.into()),
        ("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY.into()),
    ]
}

/// A TCP proxy in front of a store. `cut()` closes every connection and refuses new ones (the
/// listening socket goes away); `restore()` listens again on the same address. `cut_after(n)` cuts
/// by itself once `n` more bytes went from the store to its clients: in the middle of a download.
/// `hang()` is the worse outage: connections are still accepted, open ones stay open, and nothing
/// is forwarded either way (a store behind a black hole); `resume()` forwards again, the requests
/// held meanwhile included.
pub struct Proxy {
    pub addr: String,
    up: Arc<AtomicBool>,
    hung: Arc<AtomicBool>,
    /// Bytes from the store to clients still allowed before the proxy cuts itself.
    budget: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    target: String,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    pub fn start(listen: &str, target: &str) -> Self {
        let mut p = Self {
            addr: listen.to_owned(),
            up: Arc::new(AtomicBool::new(true)),
            hung: Arc::new(AtomicBool::new(false)),
            budget: Arc::new(AtomicU64::new(u64::MAX)),
            stop: Arc::new(AtomicBool::new(false)),
            target: target.to_owned(),
            thread: None,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        let listener = TcpListener::bind(&self.addr).expect("bind proxy");
        listener.set_nonblocking(true).unwrap();
        let (up, stop, target) = (self.up.clone(), self.stop.clone(), self.target.clone());
        let (budget, hung) = (self.budget.clone(), self.hung.clone());
        self.thread = Some(std::thread::spawn(move || {
            // Accepted while hung: held open, unanswered, until `resume()`.
            let mut held: Vec<TcpStream> = Vec::new();
            while up.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
                if !hung.load(Ordering::SeqCst) {
                    for client in held.drain(..) {
                        if let Ok(server) = TcpStream::connect(&target) {
                            pipe(client, server, up.clone(), hung.clone(), budget.clone());
                        }
                    }
                }
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        if hung.load(Ordering::SeqCst) {
                            held.push(client);
                            continue;
                        }
                        let Ok(server) = TcpStream::connect(&target) else {
                            continue;
                        };
                        pipe(client, server, up.clone(), hung.clone(), budget.clone());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }));
    }

    pub fn cut(&mut self) {
        self.up.store(false, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    pub fn restore(&mut self) {
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.budget.store(u64::MAX, Ordering::SeqCst);
        self.up.store(true, Ordering::SeqCst);
        self.spawn();
    }

    /// From now on nothing is forwarded and nothing refused: the store's clients wait.
    pub fn hang(&self) {
        self.hung.store(true, Ordering::SeqCst);
    }

    /// Forwards again, on the connections held open meanwhile too.
    pub fn resume(&self) {
        self.hung.store(false, Ordering::SeqCst);
    }

    /// Cuts once `bytes` more bytes have gone from the store to its clients.
    pub fn cut_after(&self, bytes: u64) {
        self.budget.store(bytes, Ordering::SeqCst);
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn pipe(a: TcpStream, b: TcpStream, up: Arc<AtomicBool>, hung: Arc<AtomicBool>, budget: Arc<AtomicU64>) {
    // (client → store, not counted), (store → client, counted against the budget)
    for (mut from, mut to, counted) in [
        (a.try_clone().unwrap(), b.try_clone().unwrap(), false),
        (b, a, true),
    ] {
        let (up, hung, budget) = (up.clone(), hung.clone(), budget.clone());
        std::thread::spawn(move || {
            from.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            let mut buf = [0u8; 64 * 1024];
            loop {
                if !up.load(Ordering::SeqCst) {
                    break;
                }
                if hung.load(Ordering::SeqCst) {
                    // Read nothing, send nothing, close nothing.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if counted {
                            let left = budget.load(Ordering::SeqCst);
                            if left != u64::MAX {
                                if (n as u64) >= left {
                                    let _ = to.write_all(&buf[..left as usize]);
                                    up.store(false, Ordering::SeqCst);
                                    break;
                                }
                                budget.store(left - n as u64, Ordering::SeqCst);
                            }
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break,
                }
            }
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        });
    }
}
