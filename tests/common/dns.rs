//! A small authoritative DNS server on a loopback UDP port, answering TXT queries from a table the
//! test changes while the warden runs: the ownership record, a timeout (no reply), SERVFAIL.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::UdpSocket;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::TXT;
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// What the server says for a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// TXT records, one per value.
    Txt(Vec<String>),
    /// Never reply (the client times out).
    Silence,
    ServFail,
}

struct Table {
    answers: HashMap<String, Answer>,
    changed_at: Instant,
}

pub struct DnsServer {
    pub addr: String,
    table: Arc<Mutex<Table>>,
    queries: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl DnsServer {
    pub fn start(ip: &str) -> Self {
        let socket = UdpSocket::bind((ip, 0)).expect("bind the test DNS server");
        socket.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let addr = socket.local_addr().unwrap().to_string();
        let table = Arc::new(Mutex::new(Table {
            answers: HashMap::new(),
            changed_at: Instant::now(),
        }));
        let queries = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (table, queries, stop) = (table.clone(), queries.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = socket.recv_from(&mut buf) else {
                        continue;
                    };
                    queries.fetch_add(1, Ordering::Relaxed);
                    let Ok(query) = Message::from_vec(&buf[..n]) else {
                        continue;
                    };
                    if let Some(reply) = answer(&query, &table.lock().unwrap().answers) {
                        let _ = socket.send_to(&reply, from);
                    }
                }
            })
        };
        Self {
            addr,
            table,
            queries,
            stop,
            thread: Some(thread),
        }
    }

    /// Sets what `name` answers; returns the instant of the change.
    pub fn set(&self, name: &str, answer: Answer) -> Instant {
        let mut t = self.table.lock().unwrap();
        t.answers.insert(key(name), answer);
        t.changed_at = Instant::now();
        t.changed_at
    }

    /// The name stops existing (NXDOMAIN).
    pub fn remove(&self, name: &str) -> Instant {
        let mut t = self.table.lock().unwrap();
        t.answers.remove(&key(name));
        t.changed_at = Instant::now();
        t.changed_at
    }

    pub fn set_owner(&self, name: &str, owner: &str) -> Instant {
        self.set(name, Answer::Txt(vec![owner.to_owned()]))
    }

    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }
}

fn answer(query: &Message, table: &HashMap<String, Answer>) -> Option<Vec<u8>> {
    let q = query.queries.first()?.clone();
    let mut reply = Message::new(query.metadata.id, MessageType::Response, query.metadata.op_code);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.metadata.authoritative = true;
    reply.add_query(q.clone());
    match table.get(&key(&q.name.to_ascii())) {
        None => {
            reply.metadata.response_code = ResponseCode::NXDomain;
        }
        Some(Answer::Silence) => return None,
        Some(Answer::ServFail) => {
            reply.metadata.response_code = ResponseCode::ServFail;
        }
        Some(Answer::Txt(values)) => {
            if q.query_type == RecordType::TXT {
                let name = Name::from_str(&q.name.to_ascii()).ok()?;
                for v in values {
                    reply.add_answer(Record::from_rdata(
                        name.clone(),
                        0,
                        RData::TXT(TXT::new(vec![v.clone()])),
                    ));
                }
            }
        }
    }
    reply.to_vec().ok()
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
