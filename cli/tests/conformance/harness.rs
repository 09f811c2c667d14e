//! The harness: scripted origin, the proxy in front of it, and the checks
//! each suite expectation makes.

pub(crate) use crate::proxy;
pub(crate) use std::collections::HashMap;
pub(crate) use std::convert::Infallible;
pub(crate) use std::net::SocketAddr;
pub(crate) use std::sync::{Arc, Mutex};
pub(crate) use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) use axum::body::Body;
pub(crate) use axum::http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode,
};
pub(crate) use herdguard::CacheLayer;
pub(crate) use http_body_util::BodyExt;
pub(crate) use hyper_util::client::legacy::connect::HttpConnector;
pub(crate) use hyper_util::client::legacy::Client;
pub(crate) use hyper_util::rt::{TokioExecutor, TokioIo};

// ---------------------------------------------------------------------------
// Case description
// ---------------------------------------------------------------------------

/// A header value: literal text, or an HTTP date `n` seconds from the
/// origin's "now" (the suite's integer date offsets).
#[derive(Clone, Debug)]
pub(crate) enum V {
    T(String),
    At(i64),
}

pub(crate) fn t(s: &str) -> V {
    V::T(s.to_owned())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    Cached,
    NotCached,
    EtagValidated,
    LmValidated,
}

#[derive(Clone, Debug)]
pub(crate) struct Step {
    pub(crate) method: &'static str,
    pub(crate) file: Option<&'static str>,
    pub(crate) query: Option<String>,
    pub(crate) req: Vec<(&'static str, V)>,
    pub(crate) status: Option<u16>,
    /// Response headers; the flag says whether the client checks it arrives
    /// unchanged (the suite's default for every header it sends).
    pub(crate) resp: Vec<(&'static str, V, bool)>,
    /// `Location` / `Content-Location` values are made absolute paths under
    /// the case's base URL.
    pub(crate) magic_locations: bool,
    pub(crate) body: Option<String>,
    pub(crate) expect: Option<Expect>,
    pub(crate) expect_status: Option<u16>,
    pub(crate) expect_headers: Vec<(&'static str, V)>,
    pub(crate) expect_age_over: Option<u64>,
    pub(crate) expect_missing: Vec<&'static str>,
    pub(crate) expect_req_headers: Vec<(&'static str, &'static str)>,
    pub(crate) expect_method: Option<&'static str>,
    pub(crate) expect_text: Option<&'static str>,
    pub(crate) check_body: bool,
    pub(crate) disconnect: bool,
    /// Failures here are the test's set-up failing, not the behaviour under test.
    pub(crate) setup: bool,
    /// Checks that count as set-up even when `setup` is false.
    pub(crate) setup_checks: &'static [&'static str],
    pub(crate) pause_ms: u64,
}

pub(crate) fn step() -> Step {
    Step {
        method: "GET",
        file: None,
        query: None,
        req: Vec::new(),
        status: None,
        resp: Vec::new(),
        magic_locations: false,
        body: None,
        expect: None,
        expect_status: None,
        expect_headers: Vec::new(),
        expect_age_over: None,
        expect_missing: Vec::new(),
        expect_req_headers: Vec::new(),
        expect_method: None,
        expect_text: None,
        check_body: true,
        disconnect: false,
        setup: false,
        setup_checks: &[],
        pause_ms: 0,
    }
}

impl Step {
    pub(crate) fn rh(mut self, name: &'static str, v: V) -> Self {
        self.resp.push((name, v, true));
        self
    }
    /// A response header the client does not check.
    pub(crate) fn rh_raw(mut self, name: &'static str, v: &str) -> Self {
        self.resp.push((name, t(v), false));
        self
    }
    pub(crate) fn cc(self, v: &str) -> Self {
        self.rh("Cache-Control", t(v))
    }
    pub(crate) fn q(mut self, name: &'static str, v: V) -> Self {
        self.req.push((name, v));
        self
    }
    pub(crate) fn status(mut self, s: u16) -> Self {
        self.status = Some(s);
        self
    }
    pub(crate) fn method(mut self, m: &'static str) -> Self {
        self.method = m;
        self
    }
    pub(crate) fn file(mut self, f: &'static str) -> Self {
        self.file = Some(f);
        self
    }
    pub(crate) fn body(mut self, b: &str) -> Self {
        self.body = Some(b.to_owned());
        self
    }
    pub(crate) fn expect(mut self, e: Expect) -> Self {
        self.expect = Some(e);
        self
    }
    pub(crate) fn cached(self) -> Self {
        self.expect(Expect::Cached)
    }
    pub(crate) fn not_cached(self) -> Self {
        self.expect(Expect::NotCached)
    }
    pub(crate) fn setup(mut self) -> Self {
        self.setup = true;
        self
    }
    pub(crate) fn setup_checks(mut self, c: &'static [&'static str]) -> Self {
        self.setup_checks = c;
        self
    }
    pub(crate) fn pause(mut self, ms: u64) -> Self {
        self.pause_ms = ms;
        self
    }
    /// Long enough for a `max-age=2` response to go stale.
    pub(crate) fn stale_pause(self) -> Self {
        self.pause(2100)
    }
    /// Long enough for a `max-age=SLACK_MAX_AGE` response to go stale.
    pub(crate) fn slack_stale_pause(self) -> Self {
        self.pause(SLACK_MAX_AGE * 1000 + 100)
    }
    pub(crate) fn status_is(mut self, s: u16) -> Self {
        self.expect_status = Some(s);
        self
    }
    pub(crate) fn header_is(mut self, n: &'static str, v: V) -> Self {
        self.expect_headers.push((n, v));
        self
    }
    pub(crate) fn missing(mut self, n: &'static str) -> Self {
        self.expect_missing.push(n);
        self
    }
    pub(crate) fn req_header_is(mut self, n: &'static str, v: &'static str) -> Self {
        self.expect_req_headers.push((n, v));
        self
    }
    pub(crate) fn text_is(mut self, s: &'static str) -> Self {
        self.expect_text = Some(s);
        self
    }
    pub(crate) fn no_body_check(mut self) -> Self {
        self.check_body = false;
        self
    }
    pub(crate) fn disconnect(mut self) -> Self {
        self.disconnect = true;
        self
    }
    pub(crate) fn counts_as_setup(&self, check: &str) -> bool {
        self.setup || self.setup_checks.contains(&check)
    }
}

/// `max-age` for cases that need a short-lived response to be served fresh
/// before it goes stale. The origin's Date has whole seconds, so a response
/// arrives up to 1 s old plus the trip through the proxy; with max-age=1 or 2
/// a process descheduled for a few hundred ms (a loaded CI machine) saw it
/// stale, or stale on arrival. 4 s leaves about 3 s of slack, and the pause
/// past it makes staleness certain whatever the load.
pub(crate) const SLACK_MAX_AGE: u64 = 4;

/// The suite's `fresh` template: Expires far ahead, Last-Modified, Date.
pub(crate) fn fresh() -> Step {
    step()
        .rh("Expires", V::At(100_000))
        .rh("Last-Modified", V::At(0))
        .rh("Date", V::At(0))
}

/// The suite's `stale` template: Expires in the past.
pub(crate) fn stale() -> Step {
    step()
        .rh("Expires", V::At(-5000))
        .rh("Last-Modified", V::At(-100_000))
        .rh("Date", V::At(0))
}

/// The suite's `becomeStale` template: max-age=2, then a pause.
pub(crate) fn become_stale() -> Step {
    step()
        .cc("max-age=2")
        .rh("Template-A", t("1"))
        .setup()
        .stale_pause()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A MUST of RFC 9111: a failure is a conformance failure.
    Required,
    /// What a good cache does.
    Optimal,
    /// Informational.
    Check,
}

#[derive(Clone, Debug)]
pub(crate) struct Case {
    pub(crate) id: &'static str,
    pub(crate) kind: Kind,
    pub(crate) steps: Vec<Step>,
}

pub(crate) fn case(id: &'static str, kind: Kind, steps: Vec<Step>) -> Case {
    Case { id, kind, steps }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Pass,
    /// The test's own set-up did not hold (the suite does not count these as failures).
    Setup(String),
    Fail(String),
}

// ---------------------------------------------------------------------------
// The scripted origin
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) req_num: usize,
    pub(crate) method: String,
    pub(crate) headers: HeaderMap,
    /// The checked response headers it sent, values as sent.
    pub(crate) sent: Vec<(String, String)>,
}

#[derive(Default)]
pub(crate) struct OriginState {
    pub(crate) cases: HashMap<String, Vec<Step>>,
    pub(crate) seen: HashMap<String, Vec<Seen>>,
}

pub(crate) type Shared = Arc<Mutex<OriginState>>;

pub(crate) fn http_date_at(base: SystemTime, offset: i64) -> String {
    let at = if offset >= 0 {
        base + Duration::from_secs(offset as u64)
    } else {
        base - Duration::from_secs(offset.unsigned_abs())
    };
    httpdate::fmt_http_date(at)
}

pub(crate) fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One origin answer; `None` means: drop the connection without answering.
pub(crate) fn origin_answer(shared: &Shared, req: &Request<Body>) -> Option<Response<Body>> {
    let path = req.uri().path().to_owned();
    let id = path.split('/').nth(2).unwrap_or("").to_owned();
    let mut state = shared.lock().unwrap();
    let steps = state.cases.get(&id)?.clone();
    let seen = state.seen.entry(id.clone()).or_default();
    let server_count = seen.len() + 1;
    let client_num: usize = req
        .headers()
        .get("req-num")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let num = if client_num > 0 {
        client_num
    } else {
        server_count
    };
    let Some(cfg) = steps.get(num - 1) else {
        return Some(
            Response::builder()
                .status(409)
                .body(Body::from("no such step"))
                .unwrap(),
        );
    };
    let now = SystemTime::now();
    let mut status = cfg.status.unwrap_or(200);
    if matches!(
        cfg.expect,
        Some(Expect::EtagValidated | Expect::LmValidated)
    ) {
        // Answer 304 only to the validators sent with the previous step.
        // Like the suite: the previous step's configured validators, with
        // dates as they were sent if the origin saw that step.
        let previous = seen.iter().rev().find(|s| s.req_num == num - 1);
        let configured = num.checked_sub(2).and_then(|i| steps.get(i));
        let sent = |n: &str| {
            let from_seen = previous.and_then(|p| {
                p.sent
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(n))
                    .map(|(_, v)| v.clone())
            });
            from_seen.or_else(|| {
                configured.and_then(|c| {
                    c.resp.iter().find_map(|(k, v, _)| match v {
                        V::T(s) if k.eq_ignore_ascii_case(n) => Some(s.clone()),
                        _ => None,
                    })
                })
            })
        };
        let got = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok());
        let lm_ok = sent("last-modified").is_some_and(|lm| got("if-modified-since") == Some(&lm));
        let etag_ok = sent("etag").is_some_and(|e| got("if-none-match") == Some(&e));
        status = if lm_ok || etag_ok { 304 } else { 999 };
    }
    let mut builder = Response::builder().status(status);
    let headers = builder.headers_mut().unwrap();
    let base_url = match req.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path.clone(),
    };
    headers.insert("server-base-url", HeaderValue::from_str(&base_url).unwrap());
    headers.insert("server-request-count", HeaderValue::from(server_count));
    headers.insert("client-request-count", HeaderValue::from(client_num));
    headers.insert("server-now", HeaderValue::from(unix_secs(now)));
    let mut sent = Vec::new();
    for (name, v, checked) in &cfg.resp {
        let mut value = match v {
            V::T(s) => s.clone(),
            V::At(off) => http_date_at(now, *off),
        };
        if cfg.magic_locations
            && (name.eq_ignore_ascii_case("location")
                || name.eq_ignore_ascii_case("content-location"))
        {
            value = format!("{base_url}/{value}");
        }
        let hv = HeaderValue::from_bytes(value.as_bytes()).unwrap();
        let hn = HeaderName::from_bytes(name.as_bytes()).unwrap();
        headers.append(hn.clone(), hv);
        if *checked {
            // Like the suite's server: the value checked is every line of
            // that name so far, joined.
            let joined: Vec<&str> = headers
                .get_all(&hn)
                .iter()
                .map(|v| v.to_str().unwrap_or(""))
                .collect();
            sent.retain(|(n, _): &(String, String)| !n.eq_ignore_ascii_case(name));
            sent.push((name.to_string(), joined.join(", ")));
        }
    }
    if !headers.contains_key("content-type") {
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
    }
    // The suite's server reports every request number it has seen.
    let mut numbers: Vec<String> = seen.iter().map(|s| s.req_num.to_string()).collect();
    numbers.push(client_num.to_string());
    let joined: Vec<(String, String)> = sent.clone();
    seen.push(Seen {
        req_num: client_num,
        method: req.method().to_string(),
        headers: req.headers().clone(),
        sent: joined,
    });
    headers.insert(
        "request-numbers",
        HeaderValue::from_str(&numbers.join(" ")).unwrap(),
    );
    if cfg.disconnect {
        return None;
    }
    let body = if status == 204 || status == 304 {
        Body::empty()
    } else {
        Body::from(cfg.body.clone().unwrap_or(id))
    };
    Some(builder.body(body).unwrap())
}

/// The origin: a hyper HTTP/1.1 server whose service is scripted per case.
/// A `disconnect` step drops the connection without any response.
pub(crate) async fn start_origin(shared: Shared) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                let (kill_tx, kill_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
                let mut kill_rx = kill_rx;
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let shared = Arc::clone(&shared);
                        let kill_tx = kill_tx.clone();
                        async move {
                            let (parts, _body) = req.into_parts();
                            let req = Request::from_parts(parts, Body::empty());
                            match origin_answer(&shared, &req) {
                                Some(r) => Ok::<_, Infallible>(r),
                                None => {
                                    let _ = kill_tx.send(());
                                    std::future::pending().await
                                }
                            }
                        }
                    });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = conn => {}
                    _ = kill_rx.recv() => {}
                }
            });
        }
    });
    addr
}

pub(crate) async fn start_proxy(upstream: SocketAddr, cache: CacheLayer) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = proxy::Config {
        upstream: format!("http://{upstream}").parse().unwrap(),
        purge_token: None,
    };
    let app = proxy::app(config, cache);
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

// ---------------------------------------------------------------------------
// The client side: run a case and judge it
// ---------------------------------------------------------------------------

pub(crate) struct Harness {
    pub(crate) shared: Shared,
    pub(crate) proxy: SocketAddr,
    pub(crate) client: Client<HttpConnector, Body>,
}

impl Harness {
    pub(crate) async fn start() -> Self {
        Self::with_cache(CacheLayer::new()).await
    }

    pub(crate) async fn with_cache(cache: CacheLayer) -> Self {
        let shared: Shared = Arc::default();
        let origin = start_origin(Arc::clone(&shared)).await;
        let proxy = start_proxy(origin, cache).await;
        Self {
            shared,
            proxy,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub(crate) async fn run(&self, case: &Case) -> Outcome {
        // Ids are unique per harness; make the URL unique too.
        let uid = format!("{}-{}", case.id, rand_suffix());
        self.shared
            .lock()
            .unwrap()
            .cases
            .insert(uid.clone(), case.steps.clone());
        let mut responses: Vec<(StatusCode, HeaderMap)> = Vec::new();
        for (i, s) in case.steps.iter().enumerate() {
            let num = i + 1;
            let mut url = format!("http://{}/t/{uid}", self.proxy);
            if let Some(f) = s.file {
                url.push('/');
                url.push_str(f);
            }
            if let Some(q) = &s.query {
                url.push('?');
                url.push_str(q);
            }
            let mut r = Request::builder()
                .method(Method::from_bytes(s.method.as_bytes()).unwrap())
                .uri(url)
                .header("pragma", "foo")
                .header("cache-control", "nothing-to-see-here");
            let now = SystemTime::now();
            for (n, v) in &s.req {
                let value = match v {
                    V::T(s) => s.clone(),
                    V::At(off) => http_date_at(now, *off),
                };
                r = r.header(*n, HeaderValue::from_bytes(value.as_bytes()).unwrap());
            }
            r = r
                .header("test-id", case.id)
                .header("req-num", num.to_string());
            let body = if s.method == "GET" || s.method == "HEAD" {
                Body::empty()
            } else {
                Body::from("abc")
            };
            let resp = match tokio::time::timeout(
                Duration::from_secs(10),
                self.client.request(r.body(body).unwrap()),
            )
            .await
            {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => return Outcome::Fail(format!("request {num} failed: {e}")),
                Err(_) => return Outcome::Fail(format!("request {num} timed out")),
            };
            let (parts, body) = resp.into_parts();
            let bytes = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            if let Some(o) =
                check_response(case, &uid, s, num, parts.status, &parts.headers, &bytes)
            {
                return o;
            }
            responses.push((parts.status, parts.headers));
            if s.pause_ms > 0 {
                tokio::time::sleep(Duration::from_millis(s.pause_ms)).await;
            }
        }
        let seen = self
            .shared
            .lock()
            .unwrap()
            .seen
            .get(&uid)
            .cloned()
            .unwrap_or_default();
        check_server_side(case, &responses, &seen).unwrap_or(Outcome::Pass)
    }
}

pub(crate) fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

pub(crate) fn fail(setup: bool, msg: String) -> Option<Outcome> {
    Some(if setup {
        Outcome::Setup(msg)
    } else {
        Outcome::Fail(msg)
    })
}

pub(crate) fn header_str(h: &HeaderMap, n: &str) -> Option<String> {
    let values: Vec<&str> = h
        .get_all(n)
        .iter()
        .map(|v| v.to_str().unwrap_or("<bytes>"))
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

pub(crate) fn check_response(
    case: &Case,
    uid: &str,
    s: &Step,
    num: usize,
    status: StatusCode,
    h: &HeaderMap,
    body: &[u8],
) -> Option<Outcome> {
    let res_num: Option<usize> = header_str(h, "server-request-count").and_then(|v| v.parse().ok());
    if let Some(numbers) = header_str(h, "request-numbers") {
        let list: Vec<&str> = numbers.split(' ').collect();
        let mut dedup = list.clone();
        dedup.sort_unstable();
        dedup.dedup();
        if dedup.len() != list.len() {
            return fail(false, format!("request {num} was retried"));
        }
    }
    match s.expect {
        Some(Expect::Cached) => {
            let ok = (status == StatusCode::NOT_MODIFIED && res_num.is_none())
                || res_num.is_some_and(|n| n < num);
            if !ok {
                return fail(
                    s.counts_as_setup("expected_type"),
                    format!("response {num} does not come from cache"),
                );
            }
        }
        Some(Expect::NotCached) if res_num != Some(num) => {
            return fail(
                s.counts_as_setup("expected_type"),
                format!("response {num} comes from cache"),
            );
        }
        _ => {}
    }
    if let Some(want) = s.expect_status {
        if status.as_u16() != want {
            return fail(
                s.counts_as_setup("expected_status"),
                format!("response {num} status is {status}, not {want}"),
            );
        }
    } else if let Some(want) = s.status {
        if status.as_u16() != want {
            return fail(
                true,
                format!("response {num} status is {status}, not {want}"),
            );
        }
    } else if status.as_u16() == 999 {
        return fail(
            s.counts_as_setup("expected_type"),
            format!("request {num} should have been conditional, but it was not"),
        );
    } else if status != StatusCode::OK && !s.disconnect {
        return fail(true, format!("response {num} status is {status}, not 200"));
    }
    let server_now = header_str(h, "server-now")
        .and_then(|v| v.parse::<u64>().ok())
        .map(|secs| UNIX_EPOCH + Duration::from_secs(secs));
    for (n, v) in &s.expect_headers {
        let want = match v {
            V::T(s) => s.clone(),
            V::At(off) => http_date_at(server_now.unwrap_or(UNIX_EPOCH), *off),
        };
        let got = header_str(h, n);
        if got.as_deref() != Some(want.as_str()) {
            return fail(
                s.counts_as_setup("expected_response_headers"),
                format!("response {num} header {n} is {got:?}, not {want:?}"),
            );
        }
    }
    if let Some(min) = s.expect_age_over {
        let age: Option<u64> = header_str(h, "age").and_then(|v| v.parse().ok());
        if age.is_none_or(|a| a <= min) {
            return fail(
                s.counts_as_setup("expected_response_headers"),
                format!("response {num} header Age is {age:?}, should be bigger than {min}"),
            );
        }
    }
    for n in &s.expect_missing {
        if h.contains_key(*n) {
            return fail(
                s.counts_as_setup("expected_response_headers_missing"),
                format!("response {num} includes unexpected header {n}"),
            );
        }
    }
    if s.check_body {
        let text = String::from_utf8_lossy(body);
        let want = if let Some(want) = s.expect_text {
            Some((want.to_owned(), s.counts_as_setup("expected_response_text")))
        } else if let Some(b) = &s.body {
            Some((b.clone(), true))
        } else if ![204, 304].contains(&status.as_u16()) && s.method != "HEAD" && !s.disconnect {
            Some((uid.to_owned(), true))
        } else {
            None
        };
        if let Some((want, setup)) = want {
            if text != want {
                return fail(
                    setup,
                    format!("response {num} body is {text:?}, not {want:?}"),
                );
            }
        }
    }
    let _ = case;
    None
}

pub(crate) fn check_server_side(
    case: &Case,
    responses: &[(StatusCode, HeaderMap)],
    seen: &[Seen],
) -> Option<Outcome> {
    let mut idx = 0;
    for (i, s) in case.steps.iter().enumerate() {
        let num = i + 1;
        if s.expect == Some(Expect::Cached) {
            continue;
        }
        let server = seen.get(idx);
        idx += 1;
        let type_setup = s.counts_as_setup("expected_type");
        match s.expect {
            Some(Expect::NotCached) if server.map(|r| r.req_num) != Some(num) => {
                return fail(type_setup, format!("response {num} comes from cache"));
            }
            Some(Expect::EtagValidated | Expect::LmValidated) => {
                let want = if s.expect == Some(Expect::EtagValidated) {
                    "if-none-match"
                } else {
                    "if-modified-since"
                };
                let Some(server) = server else {
                    return fail(type_setup, format!("request {num} wasn't sent to server"));
                };
                if !server.headers.contains_key(want) {
                    return fail(type_setup, format!("request {num} doesn't have {want}"));
                }
            }
            _ => {}
        }
        for (n, v) in &s.expect_req_headers {
            let got = server.and_then(|r| header_str(&r.headers, n));
            if got.as_deref() != Some(*v) {
                return fail(
                    s.counts_as_setup("expected_request_headers"),
                    format!("request {num} header {n} is {got:?}, not {v:?}"),
                );
            }
        }
        if let Some(m) = s.expect_method {
            let got = server.map(|r| r.method.as_str());
            if got != Some(m) {
                return fail(
                    s.counts_as_setup("expected_method"),
                    format!("request {num} had method {got:?}, not {m}"),
                );
            }
        }
        // Every header the origin sent for this request reaches the client unchanged.
        if let (Some(server), Some((_, h))) = (server, responses.get(i)) {
            for (n, v) in &server.sent {
                if n.eq_ignore_ascii_case("date") {
                    continue;
                }
                let got = header_str(h, n);
                if got.as_deref() != Some(v.as_str()) {
                    return fail(
                        false,
                        format!("response {num} header {n} is {got:?}, not {v:?}"),
                    );
                }
            }
        }
    }
    None
}

/// Run every case concurrently on one harness and compare with what we
/// expect: a pass, or the listed deviation (by suite test id).
pub(crate) async fn survey(h: &Harness, cases: Vec<Case>, known: &[(&str, &str)]) {
    let h = Arc::new(h);
    let runs = cases.iter().map(|c| {
        let h = Arc::clone(&h);
        async move { (c.id, c.kind, h.run(c).await) }
    });
    let results = futures_util::future::join_all(runs).await;
    let mut wrong = Vec::new();
    for (id, kind, outcome) in &results {
        let known_reason = known.iter().find(|(k, _)| k == id).map(|(_, r)| *r);
        let line = format!("{id:<55} {kind:?}: {outcome:?}");
        println!("{line}");
        match (outcome, known_reason) {
            (Outcome::Pass, None) => {}
            (Outcome::Pass, Some(_)) => wrong.push(format!("now passes, drop from KNOWN: {line}")),
            (_, Some(_)) => {}
            (_, None) => wrong.push(line),
        }
    }
    assert!(
        wrong.is_empty(),
        "unexpected outcomes:\n{}",
        wrong.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Survey groups
// ---------------------------------------------------------------------------

pub(crate) use Kind::{Check, Optimal, Required};

pub(crate) async fn run_one(c: Case) -> Outcome {
    Harness::start().await.run(&c).await
}
