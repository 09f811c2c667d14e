//! A bare hyper server, no axum: the layer is the hyper service itself (through
//! hyper-util's tower adapter), so it takes `Request<hyper::body::Incoming>`
//! and its inner service gets `Request<RequestBody<Incoming>>`. Real loopback
//! connections; every wait is bounded.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use herdguard::service::RequestBody;
use herdguard::CacheLayer;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{watch, Semaphore};
use tower::{Layer, ServiceBuilder};

/// Longest any step of these tests may take on a loaded machine.
const BOUND: Duration = Duration::from_secs(30);

/// An origin that counts its calls, records the body each call brought, and
/// answers only once the test opens its gate.
#[derive(Clone)]
struct Origin {
    calls: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    gate: Arc<Semaphore>,
}

impl Origin {
    fn new() -> Self {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            bodies: Arc::new(Mutex::new(Vec::new())),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    async fn answer(self, req: Request<RequestBody<Incoming>>) -> Response<Full<Bytes>> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let body = match req.into_body().collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => Bytes::from_static(b"<unreadable>"),
        };
        self.bodies.lock().unwrap().push(body);
        if let Ok(permit) = self.gate.acquire().await {
            permit.forget();
        }
        Response::builder()
            .header("cache-control", "max-age=60")
            .body(Full::new(Bytes::from(format!("v{n}"))))
            .expect("static response parts")
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Serve `layer` over `origin` with hyper's HTTP/1 server on a loopback
/// port. The watch counts requests as they reach the layer.
async fn serve(layer: &CacheLayer, origin: &Origin) -> (SocketAddr, watch::Receiver<usize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (arrived_tx, arrived_rx) = watch::channel(0usize);
    let arrived_tx = Arc::new(arrived_tx);
    let inner = {
        let origin = origin.clone();
        tower::service_fn(move |req: Request<RequestBody<Incoming>>| {
            let origin = origin.clone();
            async move { Ok::<_, Infallible>(origin.answer(req).await) }
        })
    };
    let cached = layer.layer(inner);
    let service = ServiceBuilder::new()
        .map_request(move |req: Request<Incoming>| {
            arrived_tx.send_modify(|n| *n += 1);
            req
        })
        .service(cached);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, arrived_rx)
}

type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Send one request; its status, `Cache-Status` and body.
async fn send(client: &TestClient, req: Request<Full<Bytes>>) -> (u16, String, Bytes) {
    let response = tokio::time::timeout(BOUND, client.request(req))
        .await
        .expect("response within the bound")
        .expect("response");
    let status = response.status().as_u16();
    let cache_status = response
        .headers()
        .get("cache-status")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, cache_status, body)
}

fn get(addr: SocketAddr, path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A burst of 40 requests on a cold key, all at the server before the origin answers, makes exactly one origin call; the request after it is a hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_on_a_cold_key_makes_one_origin_call() {
    const BURST: usize = 40;
    let layer = CacheLayer::new();
    let origin = Origin::new();
    let (addr, mut arrived) = serve(&layer, &origin).await;
    let client = client();
    let tasks: Vec<_> = (0..BURST)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { send(&client, get(addr, "/report")).await })
        })
        .collect();
    tokio::time::timeout(BOUND, arrived.wait_for(|n| *n == BURST))
        .await
        .expect("the whole burst reaches the server within the bound")
        .unwrap();
    // Enough permits for every call, so a broken single flight fails the
    // count below instead of hanging.
    origin.gate.add_permits(BURST);
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert_eq!(origin.calls(), 1, "one origin call for the whole burst");
    assert!(answers.iter().all(|(s, _, b)| *s == 200 && b == "v1"));
    let led = answers
        .iter()
        .filter(|(_, cs, _)| cs.contains("fwd=uri-miss") && !cs.contains("collapsed"))
        .count();
    assert_eq!(led, 1, "one request led; the others shared: {answers:?}");
    // The cache built the origin's request: it carried no body.
    assert_eq!(*origin.bodies.lock().unwrap(), [Bytes::new()]);

    let (status, cache_status, body) = send(&client, get(addr, "/report")).await;
    assert_eq!((status, body.as_ref()), (200, &b"v1"[..]));
    assert!(cache_status.contains("hit"), "{cache_status}");
    assert_eq!(origin.calls(), 1);
}

/// A request the layer forwards as it came (a POST) reaches the origin with the client's own body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_request_keeps_its_body() {
    let layer = CacheLayer::new();
    let origin = Origin::new();
    origin.gate.add_permits(1);
    let (addr, _arrived) = serve(&layer, &origin).await;
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}/report"))
        .body(Full::new(Bytes::from_static(b"payload")))
        .unwrap();
    let (status, _, _) = send(&client(), req).await;
    assert_eq!(status, 200);
    assert_eq!(origin.calls(), 1);
    assert_eq!(
        *origin.bodies.lock().unwrap(),
        [Bytes::from_static(b"payload")]
    );
}
