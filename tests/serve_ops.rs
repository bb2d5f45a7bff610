//! The embeddings server (`examples/common/server.rs`) as an operator sees it, on a
//! loopback socket with a real HTTP client: `/metrics` parsed by a strict Prometheus
//! text-format parser (`tests/support/prom_text.rs`), `--api-key`, and behaviour under
//! overload: a bounded queue (503 with `Retry-After`), clients that disconnect
//! (withdrawn, never computed), `--request-timeout` (504), and a batch that panics
//! (500 for its own requests only).
//!
//! The model is the small reranker fixture's encoder (`tests/data/tiny-reranker`,
//! served as an embedder: 64 tokens at most), so that 256 clients take seconds in a
//! debug build. Load and faults come from a test-only [`BatchObserver`] ([`Gate`]) set
//! on the embedder after the router is built: it slows each batch down by a set
//! delay, counts the sequences that run, and panics on a batch holding a token id
//! marked as poison. The real server's observer (its metrics) does none of this, so
//! no request can reach the fault. Every client has a timeout; every loop is bounded.
#![cfg(feature = "text")]

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use streamfuse::embedder::{BatchObserver, Embedder, EmbedderSettings};

#[path = "../examples/common/http.rs"]
mod http;
#[path = "support/prom_text.rs"]
mod prom_text;
#[path = "../examples/common/server.rs"]
mod server;
#[path = "support/serving.rs"]
mod serving;

use serving::{error_message, post_json, rerank_fixture, runtime, start};

/// The test's observer: delays each batch, counts the sequences that run, panics on
/// a sequence holding the poison token id (0: none).
#[derive(Default)]
struct Gate {
    delay_ms: AtomicU64,
    ran: AtomicUsize,
    poison: AtomicU32,
}

impl BatchObserver for Gate {
    fn batch(&self, sequences: &[&[u32]]) {
        let poison = self.poison.load(Ordering::Relaxed);
        if poison != 0 && sequences.iter().any(|s| s.contains(&poison)) {
            panic!("a poisoned batch (test fault injection)");
        }
        self.ran.fetch_add(sequences.len(), Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(self.delay_ms.load(Ordering::Relaxed)));
    }
}

/// The fixture's encoder as an embedder with `workers`, `max_wait` and a queue bound.
fn embedder(workers: usize, max_wait_ms: u64, max_queue_tokens: Option<usize>) -> Arc<Embedder> {
    let (dir, _) = rerank_fixture();
    Arc::new(
        Embedder::load_with(
            &dir,
            EmbedderSettings {
                workers,
                kernel_threads: 1,
                max_batch_tokens: 128,
                max_wait: Duration::from_millis(max_wait_ms),
                max_queue_tokens,
                ..Default::default()
            },
        )
        .expect("the fixture loads"),
    )
}

/// The router over `embedder` with `options`.
fn router(embedder: &Arc<Embedder>, options: server::Options) -> axum::Router {
    server::build(server::Config {
        embedder: Arc::clone(embedder),
        model: "tiny".into(),
        reranker: None,
        options,
    })
}

/// Starts the router over `e` with `options`, then sets `gate` as its observer
/// (replacing the metrics' one: the batch metrics stop, the others go on).
async fn start_gated(
    e: &Arc<Embedder>,
    options: server::Options,
    gate: &Arc<Gate>,
) -> serving::Running {
    let s = start(router(e, options)).await;
    e.observe(Some(Arc::clone(gate) as Arc<dyn BatchObserver>));
    s
}

/// `GET /metrics`, parsed (the parse fails the test on any malformed line).
async fn scrape(c: &mut http::Conn, headers: &[(&str, &str)]) -> prom_text::Exposition {
    let (status, h, body) = c
        .send(Method::GET, "/metrics", vec![], headers)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h["content-type"], "text/plain; version=0.0.4");
    let text = String::from_utf8(body.to_vec()).expect("UTF-8");
    prom_text::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The process's resident memory in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn metrics_count_requests_texts_batches_and_the_queue() {
    let e = embedder(1, 0, None);
    runtime().block_on(async {
        let s = start(router(&e, server::Options::default())).await;
        let mut c = http::Conn::connect(&s.host).await.unwrap();
        let mut tokens = 0;
        for input in [json!(["a cat", "a dog sleeps"]), json!("one text")] {
            let (status, body) =
                post_json(&mut c, "/v1/embeddings", json!({ "input": input })).await;
            assert_eq!(status, StatusCode::OK);
            let v: Value = serde_json::from_slice(&body).unwrap();
            tokens += v["usage"]["prompt_tokens"].as_u64().unwrap();
        }
        let (status, _) = post_json(&mut c, "/v1/embeddings", json!({"input": [""]})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = post_json(&mut c, "/embed", json!({"inputs": ["x y"]})).await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = c.request(Method::GET, "/nowhere", vec![]).await.unwrap();
        assert_eq!(status, StatusCode::NOT_FOUND);

        let m = scrape(&mut c, &[]).await;
        for (name, kind) in [
            ("streamfuse_requests_total", "counter"),
            ("streamfuse_texts_total", "counter"),
            ("streamfuse_request_duration_seconds", "histogram"),
            ("streamfuse_batch_size", "histogram"),
            ("streamfuse_batch_tokens", "histogram"),
            ("streamfuse_tokens_total", "counter"),
            ("streamfuse_queue_sequences", "gauge"),
            ("streamfuse_queue_tokens", "gauge"),
            ("streamfuse_busy_workers", "gauge"),
            ("streamfuse_workers", "gauge"),
            ("streamfuse_kernel_threads", "gauge"),
            ("streamfuse_kernel_threads_allowed", "gauge"),
        ] {
            assert_eq!(m.types.get(name).map(String::as_str), Some(kind), "{name}");
        }
        let route = |r: &'static str, status: &'static str| [("route", r), ("status", status)];
        for (name, r, status, want) in [
            ("streamfuse_requests_total", "/v1/embeddings", "200", 2.0),
            ("streamfuse_requests_total", "/v1/embeddings", "400", 1.0),
            ("streamfuse_requests_total", "/embed", "200", 1.0),
            ("streamfuse_requests_total", "unmatched", "404", 1.0),
            ("streamfuse_texts_total", "/v1/embeddings", "200", 3.0),
            ("streamfuse_texts_total", "/v1/embeddings", "400", 1.0),
            ("streamfuse_texts_total", "/embed", "200", 1.0),
        ] {
            assert_eq!(
                m.get(name, &route(r, status)),
                Some(want),
                "{name} {r} {status}"
            );
        }
        let latency = "streamfuse_request_duration_seconds_count";
        assert_eq!(m.get(latency, &[("route", "/v1/embeddings")]), Some(3.0));
        let q = [("queue", "embedder")];
        // The empty text was refused before it was queued: 4 texts ran, in 3 requests.
        let batches = m.get("streamfuse_batch_size_count", &q).unwrap();
        assert!((1.0..=4.0).contains(&batches), "{batches} batches");
        assert_eq!(m.get("streamfuse_batch_size_sum", &q), Some(4.0));
        let all_tokens = m.get("streamfuse_tokens_total", &q).unwrap();
        assert!(
            all_tokens > tokens as f64,
            "{all_tokens} tokens, {tokens} from /v1/embeddings"
        );
        assert_eq!(m.get("streamfuse_batch_tokens_sum", &q), Some(all_tokens));
        assert_eq!(m.get("streamfuse_workers", &q), Some(1.0));
        assert_eq!(m.get("streamfuse_queue_sequences", &q), Some(0.0));
        assert_eq!(m.get("streamfuse_queue_tokens", &q), Some(0.0));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        assert_eq!(m.get("streamfuse_kernel_threads", &[]), Some(cores));
        let allowed = m.get("streamfuse_kernel_threads_allowed", &[]).unwrap();
        assert!((1.0..=cores).contains(&allowed), "{allowed} of {cores}");
        // The scrape itself is counted by the next one.
        let m = scrape(&mut c, &[]).await;
        assert_eq!(
            m.get("streamfuse_requests_total", &route("/metrics", "200")),
            Some(1.0)
        );
        drop(c);
        s.stop().await;
    });
}

#[test]
fn an_api_key_guards_every_route_but_health() {
    let key = "sk-test-7f3a9c";
    let e = embedder(1, 0, None);
    let options = server::Options {
        api_key: Some(server::ApiKey::new(key).unwrap()),
        ..Default::default()
    };
    // Neither the options' Debug nor the startup line shows the key.
    for shown in [format!("{options:?}"), server::describe(&options, Some(9))] {
        assert!(
            !shown.contains(key) && shown.contains("<redacted>"),
            "{shown}"
        );
    }
    for bad in ["", "two words", "tab\there"] {
        assert!(server::ApiKey::new(bad).is_err(), "{bad:?}");
    }
    runtime().block_on(async {
        let s = start(router(&e, options)).await;
        let mut c = http::Conn::connect(&s.host).await.unwrap();
        let body = || json!({"input": "a cat"}).to_string().into_bytes();
        let right = format!("Bearer {key}");
        let wrong = format!("Bearer {key}x");
        let cut = format!("Bearer {}", &key[..key.len() - 1]);
        for headers in [
            vec![],
            vec![("authorization", wrong.as_str())],
            vec![("authorization", cut.as_str())],
            vec![("authorization", key)],
            vec![("authorization", "Basic c2stdGVzdA==")],
        ] {
            for (method, path) in [
                (Method::POST, "/v1/embeddings"),
                (Method::POST, "/embed"),
                (Method::GET, "/v1/models"),
                (Method::GET, "/metrics"),
                (Method::GET, "/info"),
            ] {
                let (status, h, resp) = c
                    .send(method.clone(), path, body(), &headers)
                    .await
                    .unwrap();
                let m = error_message(status, &resp, StatusCode::UNAUTHORIZED);
                assert!(!m.contains(key), "{m}");
                let v: Value = serde_json::from_slice(&resp).unwrap();
                assert_eq!(v["error"]["code"], "invalid_api_key", "{path} {headers:?}");
                assert_eq!(h["www-authenticate"], "Bearer");
            }
        }
        let (status, _, resp) = c
            .send(
                Method::POST,
                "/v1/embeddings",
                body(),
                &[("authorization", &right)],
            )
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
        let lower = format!("bearer {key}");
        let (status, _, _) = c
            .send(
                Method::POST,
                "/embed",
                br#"{"inputs": "a"}"#.to_vec(),
                &[("authorization", &lower)],
            )
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK, "the scheme is case-insensitive");
        let (status, _) = c.request(Method::GET, "/health", vec![]).await.unwrap();
        assert_eq!(status, StatusCode::OK, "/health needs no key");
        let m = scrape(&mut c, &[("authorization", &right)]).await;
        let denied = [("route", "/v1/embeddings"), ("status", "401")];
        assert_eq!(m.get("streamfuse_requests_total", &denied), Some(5.0));
        drop(c);
        s.stop().await;
    });
}

/// One client: connects, sends one `/v1/embeddings` request of `texts`, returns the
/// status, the `Retry-After` header and the body; `None` past 30 s.
async fn one_client(
    host: String,
    texts: Vec<String>,
) -> Option<(StatusCode, Option<String>, hyper::body::Bytes)> {
    let run = async {
        let mut c = http::Conn::connect(&host).await.unwrap();
        let body = json!({ "input": texts }).to_string().into_bytes();
        let (status, h, body) = c
            .send(Method::POST, "/v1/embeddings", body, &[])
            .await
            .unwrap();
        let retry = h
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        (status, retry, body)
    };
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .ok()
}

#[test]
fn under_overload_every_answer_is_200_or_503_and_gone_clients_leave_no_work() {
    const CLIENTS: usize = 256;
    let e = embedder(1, 0, Some(256));
    let gate = Arc::new(Gate::default());
    runtime().block_on(async {
        let s = start_gated(&e, server::Options::default(), &gate).await;
        gate.delay_ms.store(2, Ordering::Relaxed);
        let rss_before = rss_kib();

        // 256 clients at once against a queue of 256 tokens.
        let start_load = Instant::now();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let texts = (0..4)
                    .map(|j| format!("client {i} sends text {j} about cats"))
                    .collect();
                tokio::spawn(one_client(s.host.clone(), texts))
            })
            .collect();
        let (mut ok, mut busy) = (0, 0);
        for c in clients {
            let (status, retry, body) = c.await.unwrap().expect("no client hangs");
            match status {
                StatusCode::OK => ok += 1,
                StatusCode::SERVICE_UNAVAILABLE => {
                    busy += 1;
                    assert_eq!(retry.as_deref(), Some("1"), "a 503 says when to retry");
                    let m = error_message(status, &body, StatusCode::SERVICE_UNAVAILABLE);
                    assert!(m.contains("overloaded"), "{m}");
                }
                other => panic!("{other}: {}", String::from_utf8_lossy(&body)),
            }
        }
        let load_time = start_load.elapsed();
        assert_eq!(ok + busy, CLIENTS);
        assert!(ok > 0 && busy > 0, "{ok} answered, {busy} refused");
        let grown_mib = rss_kib().saturating_sub(rss_before) / 1024;
        assert!(grown_mib < 200, "RSS grew {grown_mib} MiB under load");
        eprintln!(
            "{CLIENTS} clients: {ok} x 200, {busy} x 503 in {load_time:?}; RSS +{grown_mib} MiB"
        );

        // Clients that go away before their batch runs: one request holds the only
        // worker for 1.5 s while 16 others queue and disconnect.
        gate.delay_ms.store(1500, Ordering::Relaxed);
        let ran_before = gate.ran.load(Ordering::Relaxed);
        let holder = tokio::spawn(one_client(s.host.clone(), vec!["the holder".into()]));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut gone = Vec::new();
        for i in 0..16 {
            let tcp = tokio::net::TcpStream::connect(&s.host).await.unwrap();
            let body = json!({ "input": [format!("gone client {i}")] }).to_string();
            let request = format!(
                "POST /v1/embeddings HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\n\r\n{body}",
                s.host,
                body.len()
            );
            let mut left = request.as_bytes();
            while !left.is_empty() {
                tcp.writable().await.unwrap();
                match tcp.try_write(left) {
                    Ok(n) => left = &left[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            gone.push(tcp);
        }
        let mut c = http::Conn::connect(&s.host).await.unwrap();
        // Wait until all 16 are queued, then hang up on them.
        let deadline = Instant::now() + Duration::from_secs(10);
        while scrape(&mut c, &[])
            .await
            .get("streamfuse_queue_sequences", &[("queue", "embedder")])
            != Some(16.0)
        {
            assert!(
                Instant::now() < deadline,
                "the 16 requests were never queued"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(gone);
        let deadline = Instant::now() + Duration::from_secs(10);
        let m = loop {
            let m = scrape(&mut c, &[]).await;
            if m.get("streamfuse_queue_sequences", &[("queue", "embedder")]) == Some(0.0) {
                break m;
            }
            assert!(Instant::now() < deadline, "the queue never emptied");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(
            m.get("streamfuse_queue_tokens", &[("queue", "embedder")]),
            Some(0.0)
        );
        assert_eq!(
            m.get(
                "streamfuse_cancelled_sequences_total",
                &[("queue", "embedder")]
            ),
            Some(16.0),
            "every gone client's text was withdrawn"
        );
        let (status, _, _) = holder.await.unwrap().expect("the holder is answered");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            gate.ran.load(Ordering::Relaxed) - ran_before,
            1,
            "only the holder's text ran"
        );

        // After the load a request is answered in normal time.
        gate.delay_ms.store(0, Ordering::Relaxed);
        let t = Instant::now();
        let (status, _) = post_json(&mut c, "/v1/embeddings", json!({"input": "after"})).await;
        assert_eq!(status, StatusCode::OK);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        drop(c);
        s.stop().await;
    });
}

#[test]
fn a_request_past_the_timeout_gets_504_and_leaves_the_queue() {
    let e = embedder(1, 0, None);
    let gate = Arc::new(Gate::default());
    let options = server::Options {
        request_timeout: Some(Duration::from_millis(150)),
        ..Default::default()
    };
    runtime().block_on(async {
        let s = start_gated(&e, options, &gate).await;
        gate.delay_ms.store(600, Ordering::Relaxed);
        // The first runs (too slowly), the second waits behind it: both time out.
        let a = tokio::spawn(one_client(s.host.clone(), vec!["first".into()]));
        tokio::time::sleep(Duration::from_millis(80)).await;
        let b = tokio::spawn(one_client(s.host.clone(), vec!["second".into()]));
        for c in [a, b] {
            let (status, _, body) = c.await.unwrap().expect("answered");
            let m = error_message(status, &body, StatusCode::GATEWAY_TIMEOUT);
            assert!(m.contains("--request-timeout of 150 ms"), "{m}");
        }
        let mut c = http::Conn::connect(&s.host).await.unwrap();
        let m = scrape(&mut c, &[]).await;
        let q = [("queue", "embedder")];
        assert_eq!(m.get("streamfuse_cancelled_sequences_total", &q), Some(1.0));
        assert_eq!(m.get("streamfuse_queue_sequences", &q), Some(0.0));
        gate.delay_ms.store(0, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(700)).await;
        let (status, _) = post_json(&mut c, "/v1/embeddings", json!({"input": "later"})).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            gate.ran.load(Ordering::Relaxed),
            2,
            "the withdrawn text never ran"
        );
        drop(c);
        s.stop().await;
    });
}

#[test]
fn a_panicking_batch_fails_only_its_own_requests() {
    // A wait of 100 ms puts concurrent requests in one batch.
    let e = embedder(1, 100, None);
    let gate = Arc::new(Gate::default());
    let poison = e.model().vocab_size() as u32 - 1;
    runtime().block_on(async {
        let s = start_gated(&e, server::Options::default(), &gate).await;
        gate.poison.store(poison, Ordering::Relaxed);
        let host = s.host.clone();
        let send = |input: Value, path: &'static str| {
            let host = host.clone();
            tokio::spawn(async move {
                let mut c = http::Conn::connect(&host).await.unwrap();
                let field = if path == "/embed" { "inputs" } else { "input" };
                post_json(&mut c, path, json!({ field: input })).await
            })
        };
        let good = send(json!([[2, 5, 6, 3]]), "/v1/embeddings");
        let bad = send(json!([[2, 5, poison, 3], [2, 7, 3]]), "/v1/embeddings");
        let text = send(json!(["a text beside them"]), "/v1/embeddings");
        let tei = send(json!([[2, poison, 3]]), "/embed");
        for ok in [good, text] {
            let (status, body) = ok.await.unwrap();
            assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        }
        let (status, body) = bad.await.unwrap();
        let m = error_message(status, &body, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(m.contains("panicked") && m.contains("poisoned"), "{m}");
        let (status, body) = tei.await.unwrap();
        assert_eq!(
            status,
            StatusCode::FAILED_DEPENDENCY,
            "TEI's status for a backend error"
        );
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error_type"], "Backend");
        // Later requests go on.
        let mut c = http::Conn::connect(&s.host).await.unwrap();
        let (status, _) = post_json(&mut c, "/v1/embeddings", json!({"input": [[2, 9, 3]]})).await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = c.request(Method::GET, "/health", vec![]).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        drop(c);
        s.stop().await;
    });
}
