//! Write load for the delta benchmark: CONCURRENCY clients doing single-key puts of ~1 KiB values
//! (and some deletes) for SECONDS, as fast as etcd takes them, or capped at RATE writes/s in total.
//! Usage: `cargo run --release --example load -- ENDPOINT SECONDS [CONCURRENCY] [RATE]`.

use std::time::{Duration, Instant};

use etcd_client::Client;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let endpoint = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "http://127.0.0.1:2379".into());
    let seconds: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let concurrency: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(32);
    let rate: u64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let mut client = Client::connect([endpoint.clone()], None).await?;
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(w);
            let value: String = (0..1024).map(|_| char::from(b'a' + rng.u8(..26))).collect();
            let per_task = if rate > 0 {
                Some(Duration::from_secs_f64(concurrency as f64 / rate as f64))
            } else {
                None
            };
            let mut n = 0u64;
            let mut next = Instant::now();
            while Instant::now() < deadline {
                let key = format!("/registry/events/load/w{w}-{}", n % 500);
                if n % 10 == 9 {
                    client.delete(key, None).await?;
                } else {
                    client.put(key, value.as_bytes(), None).await?;
                }
                n += 1;
                if let Some(p) = per_task {
                    next += p;
                    tokio::time::sleep_until(next.into()).await;
                }
            }
            Ok::<u64, etcd_client::Error>(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{total} writes in {secs:.1}s = {:.0} writes/s",
        total as f64 / secs
    );
    Ok(())
}
