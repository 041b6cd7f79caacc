//! Fills an etcd with Kubernetes-like objects for the benchmarks: JSON values of about 4 KiB, half
//! structure and half random content, so they compress about 2× (like real cluster state, unlike
//! random bytes). Usage: `cargo run --release --example fill -- ENDPOINT MIB [PREFIX]`.

use std::time::Instant;

use etcd_client::{Client, Txn, TxnOp};

fn object(rng: &mut fastrand::Rng, i: u64) -> Vec<u8> {
    let mut random = String::with_capacity(2048);
    for _ in 0..2048 {
        random.push(char::from(b'A' + rng.u8(..58)));
    }
    let labels: String = (0..20)
        .map(|k| format!("\"label-{k}\":\"value-{}\",", k % 7))
        .collect();
    format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"cm-{i}\",\"namespace\":\"bench\",\
         \"labels\":{{{labels}\"app\":\"bench\"}},\"annotations\":{{\"kubectl.kubernetes.io/last-applied-configuration\":\"\"}}}},\
         \"data\":{{\"blob\":\"{random}\",\"config.yaml\":\"{}\"}}}}",
        "key: value\\n".repeat(100)
    )
    .into_bytes()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let endpoint = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "http://127.0.0.1:2379".into());
    let mib: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(256);
    let prefix = args
        .get(3)
        .cloned()
        .unwrap_or_else(|| "/registry/configmaps/bench/".into());
    let target = mib * 1024 * 1024;
    let started = Instant::now();
    let mut tasks = Vec::new();
    let workers = 4u64;
    for w in 0..workers {
        let mut client = Client::connect([endpoint.clone()], None).await?;
        let prefix = prefix.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(w);
            let mut written = 0u64;
            let mut i = w;
            while written < target / workers {
                let mut ops = Vec::new();
                let mut batch = 0usize;
                while batch < 1_000_000 && ops.len() < 100 {
                    let v = object(&mut rng, i);
                    batch += v.len();
                    ops.push(TxnOp::put(format!("{prefix}cm-{i:010}"), v, None));
                    i += workers;
                }
                client.txn(Txn::new().and_then(ops)).await?;
                written += batch as u64;
            }
            Ok::<u64, etcd_client::Error>(written)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    let mut client = Client::connect([endpoint], None).await?;
    let status = client.status().await?;
    println!(
        "wrote {} MiB in {:.1}s; etcd db size {} MiB, revision {}",
        total >> 20,
        started.elapsed().as_secs_f64(),
        status.db_size() >> 20,
        status.header().map(|h| h.revision()).unwrap_or(0)
    );
    Ok(())
}
