//! # herdguard
//!
//! A stampede-proof read-through cache for HTTP services, as a Tower layer.
//!
//! When a hot entry is missing or expired, exactly one request recomputes it;
//! every other request for that key waits for that one result or is served
//! the stale copy at once.
//!
//! ## Request flow
//!
//! ```text
//! request ─► cacheable? (GET/HEAD, no Upgrade/If-Match, no request no-store)
//!               │ no ─► inner service, Cache-Status: fwd=method|request
//!               ▼ yes
//!           key = hash(host:port, path, query, Authorization present?, Vary values)
//!               │
//!           memory: fresh ─► HIT (no await, no allocation beyond headers)
//!                   stale ─► STALE now; one background refresh
//!                   pass  ─► inner service (origin said "uncacheable" recently)
//!                   miss  ─► flight for this key running?
//!                               yes ─► wait (bounded) and share its outcome
//!                               no  ─► lead: call the inner service in a spawned task,
//!                                      buffer the body (≤ 8 MiB), store if allowed,
//!                                      wake every waiter
//! a GET with one byte range ─► the same flow, then its 206 (or 416) is cut
//!                              from the complete 200 (see "Byte ranges")
//! ```
//!
//! ## With Redis: one origin call per key per cluster
//!
//! [`CacheLayerBuilder::redis`] (or [`CacheBuilder::redis`]) shares entries
//! through Redis. Memory stays in front as an L1 (fresh answers from it for
//! 1 s by default, never beyond the entry's own freshness; stale answers
//! within the grace while a refresh asks Redis), and the in-process flight stays in front of
//! Redis, so each process sends one lookup per key per flight however many
//! requests wait in it. The local leader makes **one** round trip (a Lua
//! script, by EVALSHA) that returns one of:
//!
//! ```text
//! fresh entry             ─► HIT (fill L1)
//! stale entry, lease won  ─► everyone here gets STALE now; refresh in background
//! stale entry, lease held ─► STALE
//! no entry, lease won     ─► LEADER: call the origin (watchdog extends the lease
//!                            every lease/3), fenced write + release + SPUBLISH
//! no entry, lease held    ─► WAIT for the fill notification (sharded pub/sub on
//!                            the entry's own channel, one subscriber connection
//!                            per process, bounded poll as a fallback); the
//!                            notice carries the entry up to
//!                            `RedisOptions::notice_entry_limit` (64 KiB), else
//!                            look again; if the lease lapsed with no fill,
//!                            compete again: exactly one wins
//! pass marker             ─► go to the origin (known uncacheable)
//! ```
//!
//! Each entry's keys share one hash tag made from the hex of the key's hash
//! (`{ns}:{H}:v`, the entry or the pass marker, whose PTTL past the entry's
//! keep time (its stale window, or its stale-if-error window when longer) is
//! its freshness; `:lock`; `:fence`), so no request text
//! reaches a key name and every script touches one slot. Every lease comes
//! with a fence token; the write script stores an entry only if its token is
//! strictly newer than the newest accepted one, so a leader whose lease
//! lapsed (GC pause, slow origin) cannot overwrite a newer value. Rejected
//! writes are counted in [`Stats::fenced_rejections`]. A token is above the
//! last one issued for the key, above its high-water mark (or, when the
//! fence was lost, the stored entry's own token) and above the
//! Redis server's clock in microseconds: it never repeats, not after a
//! FLUSHALL, an evicted fence, a restart without persistence or a
//! failover to a replica that missed the last tokens. (This assumes the
//! server clock does not step back further than the time between two
//! leases of a key.)
//!
//! Redis Cluster ([`RedisOptions::cluster`]) runs the same scripts unchanged:
//! entries spread over the slots, and fill notifications are published on
//! `{ns}:{H}:fill` in the entry's own slot (SPUBLISH), so they reach only the
//! shard that owns the entry. `rediss://` (TLS via rustls, cargo feature
//! `tls`) and ACL credentials in the URL are supported; credentials never
//! reach logs, errors or `Debug` output. See [`RedisOptions`].
//!
//! ## Layout
//!
//! The modules follow the request flow, top to bottom; nothing below
//! `http` imports it, and no two files import each other.
//!
//! ```text
//! http/            everything that knows HTTP
//!   layer.rs         CacheLayer (the public handle, purges)
//!   builder.rs       CacheLayerBuilder: every setting, its bounds checked
//!   state.rs         what every clone and route layer shares
//!   service/         the Tower service, one file per step:
//!     mod.rs           classify the request, find the candidate, pick the path
//!     coalesce.rs      miss: lead or follow the key's flight, or be released
//!     origin.rs        one origin request as the flight's computation
//!     streamed.rs      a fill that spans frames, read once by every reader
//!     fill.rs          the origin's answer and verdict turned into a fill
//!     direct.rs        calls outside any flight (Honor reloads, released)
//!     respond.rs       building answers from entries; the layer's own answers
//!     target.rs        where a request's entry lives (base and variant key)
//!   policy/          RFC 9111: directives, request, freshness, storability,
//!                    targeted (RFC 9213)
//!   stream/          a streaming fill's shared body: window, pace (cut-off
//!                    rules), reader, registry
//!   vary.rs, conditional.rs, purge.rs, route.rs, body.rs,
//!   request_body.rs, response.rs (CachedResponse), cache_status.rs, future.rs,
//!   warnings.rs (the one WARN per route for answers without freshness)
//! engine/          the HTTP-agnostic read-through state machine
//!   cache.rs         the public Cache<V>
//!   resolve.rs       Engine::resolve: the miss path in reading order
//!   flight.rs        the local single flight
//!   remote.rs        leading and waiting across instances (Redis)
//!   quorum_lease.rs  a key's lease on the Redlock quorum
//!   fill.rs, refresh.rs, outside_flight.rs, retained.rs, purge_log.rs,
//!   value.rs (Value), envelope.rs (the stored bytes)
//! store/           memory.rs (embedded default and L1), notice.rs (the purge
//!                  notice's bytes), redis/ (connection
//!                  and breaker, keys, Lua scripts as .lua files, fills,
//!                  purge bus, cluster, TLS)
//! lock/            Redlock and the lease watchdog
//! key.rs, error.rs, metrics.rs, inspect.rs (diagnostics for the CLI)
//! ```
//!
//! ## Failure behaviour
//!
//! - **Redis down or slow:** every call has a timeout (connect 1 s, reply
//!   250 ms, pool wait 250 ms by default). A failure opens a circuit breaker:
//!   the layer serves from memory, coalesces in-process, and calls the origin
//!   through the local leader; it probes Redis again after a doubling back-off
//!   (250 ms to 5 s) and goes back to it by itself. Redis trouble is never a
//!   5xx and never a panic.
//! - **Corrupt or unknown-version entry in Redis:** every entry carries a
//!   checksum of its encoding and its payload and body lengths, checked on
//!   decode; a truncated, bit-flipped, foreign or older-version entry is a
//!   miss (never served), logged (at most once per 10 s per process, counted
//!   in `herdguard_corrupt_entries_total`) and overwritten by the next fill.
//!   No input makes decoding panic or allocate beyond its length.
//! - **A leader process dies:** its lease expires (5 s by default) and exactly
//!   one waiter wins the next election.
//!
//! - **The origin errors, times out or panics:** a waiter gets only what
//!   the cache could have served it. Shared with every waiter of the
//!   flight: the layer's own 502/504 for a failed, panicked or timed-out
//!   call (it carries no origin bytes; the request that led gets the inner
//!   service's own error), and an error response stored for everyone (one
//!   with freshness, such as `500` with `max-age=30`). An error page that
//!   is not stored (a `500` without freshness, maybe made with the leader's
//!   cookie) goes to the request that led alone; each waiter gets
//!   `stale-if-error` where its stored copy allows, or calls the origin
//!   itself under `fallback_limit` (`detail=error-not-shared`), so a
//!   failing origin sees at most that many calls at once beside the flight,
//!   and nobody receives an error page made for another request. The next
//!   request elects a new leader.
//! - **`stale-if-error` on every instance:** an origin error never
//!   replaces a stored response that is being revalidated. With Redis the
//!   shared entry is kept for its `stale-if-error` window past freshness
//!   (at most a day), so an instance with no copy of its own reads it,
//!   keeps it aside, sends its validators, and answers an error with it;
//!   no instance stores the error over it while the window lasts.
//! - **The leading request is cancelled** (client disconnect): the origin call
//!   runs in its own task and still completes for the waiters.
//! - **A wait runs out** (`max_wait`, by default the origin timeout + 5 s,
//!   so only a leader stuck past its own timeout gets there): the waiter
//!   calls the origin itself, uncached, under a concurrency cap
//!   (`fallback_limit`); with the cap full it keeps waiting on the flight
//!   instead, at most one more origin timeout. See *Bounds and timeouts*.
//! - **Uncacheable response:** waiters go to the origin on their own (see
//!   [what is shared between users](#what-is-shared-between-users)).
//! - **Response without freshness information:** not stored and not handed
//!   to waiters (unless you opt in); give it a
//!   [`default_ttl`](CacheLayerBuilder::default_ttl) to store and share it.
//!   Such answers say `Cache-Status: …; detail=no-freshness`, count in
//!   `herdguard_not_stored_total{reason="no-freshness"}`, and the layer logs
//!   one WARN per route (at most once per 10 minutes per route, once a
//!   second per layer) naming the fix; see
//!   [no default TTL](#no-default-ttl-for-answers-without-freshness).
//! - **Body larger than the limit:** not stored, but still shared: one
//!   origin call for the readers of each instance, see
//!   [streamed fills](#streamed-fills).
//!
//! ## HTTP choices
//!
//! A shared cache per RFC 9111, with RFC 5861 and RFC 9211:
//!
//! - **Stored** only with explicit freshness (`s-maxage`, then `max-age`,
//!   then `Expires` − `Date`), or heuristic freshness when you turn it on
//!   ([`heuristic_freshness`](CacheLayerBuilder::heuristic_freshness): 10 %
//!   of the `Last-Modified` age, capped), or a
//!   [`default_ttl`](CacheLayerBuilder::default_ttl) you set. Age follows
//!   §4.2.3 (`Age`, `Date`, response delay) and is sent on every answer.
//! - **Never stored:** `no-store`, `private`, `Set-Cookie`, `Vary: *` (or an
//!   unreadable Vary), 206 (see byte ranges below), 304, 1xx, and responses to requests with
//!   `Authorization` unless `public`, `s-maxage` or `must-revalidate` allow it
//!   (§3.5; see below for who may reuse them).
//! - **Response `no-cache`** is stored (when it has a validator) and
//!   revalidated before every use. `must-revalidate`, `proxy-revalidate` and
//!   `s-maxage` forbid serving stale beyond what the origin granted
//!   explicitly: `stale-while-revalidate` and `stale-if-error` still hold
//!   with `s-maxage`, not with the other two.
//! - **Request directives:** a request that refuses the stored response
//!   (`no-cache`, `max-age=0`, `Pragma: no-cache`, a `max-age` below the
//!   entry's age, a `min-fresh` it cannot meet) never costs an origin call of
//!   its own by default: it joins the refresh running for its key, or starts
//!   one, which goes to the origin with the stored validators (so the origin
//!   may answer 304) and replaces the entry; with Redis one such refresh runs
//!   per key across the cluster. So a reload may share a refresh that
//!   started a moment before it, never the entry it refused.
//!   [`ReloadMode`] picks `Honor` (each its own call, under the fallback
//!   cap) or `Ignore` (served from the cache) instead. `no-store` goes
//!   forward and stores nothing; `max-stale` may accept a stale response
//!   (never over `must-revalidate`); `only-if-cached` is a 504 when nothing
//!   usable is stored.
//! - **Revalidation:** a stored response is kept past its stale grace
//!   ([`keep_for_revalidation`](CacheLayerBuilder::keep_for_revalidation),
//!   10 min). Once stale, one request per key sends `If-None-Match` /
//!   `If-Modified-Since`; a 304 replaces the stored headers it carries (all
//!   but `Content-Length` and hop-by-hop ones) and restarts freshness from the
//!   304's own `Date`/`Age`. A 304 naming another ETag is not applied; the
//!   request is repeated without validators.
//! - **Client conditionals:** `If-None-Match` (weak comparison) and, without
//!   it, `If-Modified-Since` are answered 304 from the cache. `If-Match` and
//!   `If-Unmodified-Since` go to the origin untouched.
//! - **Byte ranges** (RFC 9110 §14): a GET with `Range` takes the same path
//!   as a plain GET for its URL (same key, same flight, same stored entry),
//!   and its answer is cut from the complete 200: a 206 with
//!   `Content-Range` for one range (`a-b`, `a-`, `-n`), a 416 with
//!   `Content-Range: bytes */len` when the range starts past the end.
//!   `Cache-Status` and `Age` are those of the 200 it was cut from.
//!   - A fill never sends `Range` (nor `If-Range`) to the origin: it asks for
//!     the whole object, once, shared with the plain GETs of the URL, so what
//!     they receive and what is stored is the same as without range requests.
//!     A streamed fill's range readers get their bytes as they arrive (the
//!     206 ends when its last byte is in, before the rest of the body).
//!   - `If-Range` holds for an equal strong ETag, or a date equal to a strong
//!     `Last-Modified` (a second or more before `Date`); a weak ETag or a
//!     mismatch gets the whole 200. `If-None-Match` / `If-Modified-Since`
//!     come first (RFC 9110 §13.2.2): a match is a 304 whatever the range.
//!   - Several ranges, a unit other than `bytes`, or invalid syntax: `Range`
//!     is ignored and the whole 200 is sent, as RFC 9110 §14.2 allows (no
//!     `multipart/byteranges`). `Range` on HEAD is ignored (it is defined
//!     for GET only): a plain HEAD answer.
//!   - Only a 200 of known length is cut: a body in memory, or a streamed
//!     one with `Content-Length`. A streamed body of unknown length (chunked,
//!     too large to store) is sent whole as a 200, never as a 206. Any other
//!     status (404, 301 …) is sent as it is.
//!   - A body too large to store ([`max_body_bytes`](CacheLayerBuilder::max_body_bytes)):
//!     the range requests of the fill that finds out are cut from its
//!     stream; after it, the instance remembers the key (4096 keys, 60 s)
//!     and range requests for it go to the origin with their `Range`
//!     (`fwd=request; detail=too-large`). Plain GETs still share one fill.
//!   - Where the request goes to the origin on its own (a bypass,
//!     hit-for-pass, a waiter released because the answer was not for it),
//!     its `Range` goes with it, and the origin's 206 is passed through.
//!   - A 206 from the origin is never stored: the cache only fills with
//!     whole objects, so a stored partial could only come from an origin
//!     that answered a plain GET with a 206, and combining partial entries
//!     (RFC 9111 §3.4) would add a second kind of entry to every store and
//!     to the fence rules for little gain. Such a 206 is the leading
//!     request's answer alone and sets no pass marker: the URL stays
//!     cacheable.
//! - **Targeted cache control** (RFC 9213): a valid `CDN-Cache-Control`
//!   (a Structured Fields Dictionary) replaces `Cache-Control` and
//!   `Expires` for this cache, and a header of your own
//!   ([`targeted_cache_control`](CacheLayerBuilder::targeted_cache_control))
//!   goes above it; an invalid or empty one is ignored whole. Yours is
//!   removed from responses by default; `CDN-Cache-Control` is passed on.
//! - **Vary:** the names a URL varies on are learned from its responses, and
//!   each combination of the request's values has its own key, so variants
//!   coexist. A stored variant is still compared header by header before use;
//!   a request that finds another variant under its key (this instance had
//!   not learned the names yet) leads or joins the flight of its own
//!   variant, so variant misses coalesce like any other miss.
//!   Values are compared in a normal form: field lines combined, whitespace
//!   around commas dropped; `Accept`, `Accept-Language` and `Accept-Charset`
//!   also lowercased and ordered by q-value (equal preferences in any
//!   order). `Accept-Encoding` falls into one of four buckets by which of
//!   `br` and `gzip` it accepts (`br, gzip`, `br`, `gzip`, `identity`;
//!   `q=0` excludes), and the request that fills an entry carries the
//!   bucket as its `Accept-Encoding`: it offers every coding all requests
//!   of the bucket accept (a gzip-only origin still compresses for
//!   browsers) and none that any of them refused.
//! - **Unsafe methods:** a 2xx/3xx answer to POST, PUT, PATCH or DELETE
//!   purges the target URL (every variant) and same-origin `Location` /
//!   `Content-Location`.
//! - **Invalidation:** [`CacheLayer::purge_url`] (a `&str` or a `Uri`),
//!   [`CacheLayer::purge_key`] (with [`CacheLayer::route_key`], every entry a
//!   [`RoutePolicy::key`] function named) and [`CacheLayer::purge_tag`]
//!   (space-separated `Surrogate-Key` tags). A
//!   URL key ignores the scheme; host and port count, as in the cache key.
//!   With Redis, a purge also deletes the
//!   Redis copies (entries are indexed by URL and tag) and publishes a notice
//!   that clears every instance's memory. An instance that misses the notice
//!   stops answering fresh from its copy when its L1 lifetime (1 s) ends; a
//!   stale answer from it starts a refresh that finds the entry gone. Each
//!   purge returns a [`PurgeHandle`]: drop it to purge in the background, or
//!   await it to learn whether Redis was reached. `Surrogate-Key` is read
//!   when a response is stored and stripped from every response to a client
//!   (unless [`forward_surrogate_key`](CacheLayerBuilder::forward_surrogate_key)).
//!   A purge beats a fill already running: that fill's answer still goes to
//!   the requests waiting on it, but it is stored nowhere, on any instance,
//!   whether the notice reached it or not. The purge stamps its URL or tag
//!   in Redis before it reads the index and raises the fence of every key it
//!   finds; a fill records its keys (its Vary variant and base-key copies
//!   too) in the index before its fenced write and checks the stamp there.
//!   Vary copies are written only after the fill's own write is accepted,
//!   under its token. The handle resolves to `Ok` only when the purge is
//!   done everywhere; [`PurgeError::local_only`] says it reached this
//!   process only (Redis unreachable). With Redis configured, copies made
//!   outside it (Redis unreachable, or a failed write) live at most the L1
//!   lifetime. docs/operations.md has the table of what a purge guarantees.
//! - **Soft purge:** [`CacheLayer::soft_purge_url`],
//!   [`soft_purge_key`](CacheLayer::soft_purge_key) and
//!   [`soft_purge_tag`](CacheLayer::soft_purge_tag) mark the entries stale
//!   instead of removing them (memory and Redis, every instance): one
//!   refresh per cluster, every request answered the stale copy meanwhile
//!   (`fwd=stale; …; detail=soft-purge`), for at most the entry's stale
//!   window (`stale-while-revalidate` or grace) counted from the purge.
//!   Entries with no stale window (`must-revalidate`, `no-cache` …) are
//!   purged. A soft purge beats an older fill as a purge does.
//! - **Cache-Status** names every outcome: `hit; ttl=N` (plus
//!   `detail=stale` / `grace` / `max-stale` when served stale), `fwd=stale;
//!   ttl=N; detail=soft-purge` (served stale after a soft purge), `fwd=uri-miss |
//!   vary-miss | stale | request | method`, `fwd-status`, `stored`,
//!   `collapsed`, `ttl`, and `detail=` for hit-for-pass, hit-for-miss (a
//!   request under a pass marker got a storable answer, now stored), uncacheable,
//!   error-not-shared, no-freshness (no `max-age`, `s-maxage` or `Expires`
//!   and no TTL applies), too-large, stale-if-error, only-if-cached,
//!   wait-timeout, overloaded, origin-timeout and errors.
//! - HEAD is answered from the GET entry; a HEAD miss fills it with a GET.
//!
//! ## Grace and refresh-ahead
//!
//! - **Grace** ([`CacheLayerBuilder::grace`], off by default): an expired
//!   entry is served at once for up to the grace past its freshness while one
//!   refresh runs, even without the origin's `stale-while-revalidate`
//!   (`Cache-Status: …; detail=grace`). Never for `must-revalidate`,
//!   `proxy-revalidate`, `s-maxage` or `no-cache` responses. Entries are
//!   kept in memory and in Redis for freshness + grace.
//! - **Refresh-ahead** ([`CacheLayerBuilder::refresh_ahead`], on by default:
//!   the last 25 % of the freshness, or twice the origin time this instance
//!   last measured for the entry if that is longer): the first hit on a copy
//!   in that part starts one background refresh. With Redis the lookup
//!   script takes the entry's lease while the entry is still fresh, so the
//!   cluster makes one call and every other instance keeps its copy. Under
//!   steady load no request waits for the origin and none is answered past
//!   max-age. It costs at most one origin call per key per freshness window
//!   (each refresh starts a new window; a key nobody hits near its end is
//!   never refreshed), which is why it is on by default. A failed refresh is
//!   not retried ahead: the entry then expires as usual. With a Redlock lease
//!   backend entries are not refreshed ahead.
//!
//!   A fixed fraction rather than XFetch (probabilistic early expiration,
//!   Vattani et al. 2015): XFetch spreads independent recomputations so that
//!   uncoordinated callers rarely collide. Here the lease already makes the
//!   refresh single, so randomness only adds variance: at thousands of hits
//!   per second XFetch fires almost as soon as an entry is stored, which
//!   would cost a call per origin time rather than per window. A fixed
//!   point is deterministic, bounded and testable under paused time; the
//!   measured origin time gives it XFetch's one advantage, a lead that
//!   grows with a slow origin.
//!
//! ## Memory
//!
//! [`capacity_bytes`](CacheLayerBuilder::capacity_bytes) bounds what the
//! layer keeps: entries (L1) get about 73 %, retained copies (kept past their
//! stale window for 304 revalidation and `stale-if-error`) 25 %, and the Vary
//! index 1/64; each evicts on its own. [`CacheLayer::memory_bytes`] reports
//! the total. Bodies being received are bounded by
//! [`max_body_bytes`](CacheLayerBuilder::max_body_bytes) each (and the
//! leader cap), not by the capacity. Measured: one instance at a 32 MiB
//! capacity fed distinct 200 KB entries stays below 1.25 × capacity + 64 MiB
//! RSS (`cargo bench --bench soak -- --large`).
//!
//! ## What is shared between users
//!
//! This section is the one description of what the cache hands from one
//! user to another; the README and docs/operations.md link here.
//!
//! herdguard is a **shared** cache (RFC 9111): a stored response is served to
//! every request with the same key. The key is made of the **host**
//! (lowercased) with its **port**, the **path**, the **query**, **whether**
//! the request carries `Authorization`, the values of any
//! [`key_header`](CacheLayerBuilder::key_header) you configure, and the
//! values of the request headers the response named in `Vary` (credentials
//! too, when the answer may only be reused for them: see the table). A
//! route's [key function](RoutePolicy::key) replaces host, path and query,
//! and nothing else. Nothing else is in it: in particular **`Cookie` is not
//! part of the key.**
//!
//! So the origin decides what is shared, through its response headers:
//!
//! | request | response | stored? | shared with other users? |
//! |---|---|---|---|
//! | no `Authorization` | `max-age` / `s-maxage` / `Expires` | yes | **yes**: everyone with the same URL (and `Vary` values) |
//! | no `Authorization` | `Cache-Control: private` | no | no (pass marker for `pass_ttl`; the next GET asks again and stores a storable answer: hit-for-miss) |
//! | any | `Cache-Control: no-store` | no | no |
//! | any | `Set-Cookie` | no; a stored entry for the URL stays | no: this answer goes to its own request only |
//! | any | `Vary: *` | no | no |
//! | any | `Vary: Cookie` + `max-age` | yes, one entry per cookie value | only with requests carrying the *same* `Cookie`, on every instance (the variant's names live in Redis beside it) |
//! | any | no `max-age` / `s-maxage` / `Expires` | no (unless `default_ttl` or `heuristic_freshness`) | no: each waiter calls the origin itself, unless you opt in with `share_uncacheable_with_waiters` |
//! | `Authorization` | `public` or `s-maxage` | yes | with other **authorized** requests |
//! | `Authorization` | `max-age` only | no | no: this answer goes to its own request only |
//! | `Authorization` | `max-age, must-revalidate` | yes (RFC 9111 §3.5), keyed by a digest of the credentials | only with requests carrying the *same* credentials |
//! | `GET` with `Range` | any | as for a plain GET: the fill asks for the whole object | the whole object; each range request gets its own slice |
//! | `GET`/`HEAD` with `If-Match`, `Upgrade`, or a body | any | no | no: bypassed untouched |
//! | `GET`/`HEAD` with an invalid `Host`, or a method or URL override header | any | no | no: bypassed untouched (below) |
//! | `POST`, `PUT`, `PATCH`, `DELETE` | 2xx/3xx | no | no; the URL (every variant) is purged |
//! | `Cache-Control: no-store` in the request | any | no | no |
//!
//! What **never** crosses between users:
//!
//! - A response with `Set-Cookie`, `private` or `no-store`, or `Vary: *`,
//!   whether stored or handed to coalesced waiters.
//! - An answer to an authorized request reaching an anonymous one, or the
//!   other way round; an answer reused for other credentials, unless it
//!   says `public` or `s-maxage`.
//! - Anything from a request that bypassed the cache (unsafe methods,
//!   conditional `If-Match`, request `no-store`, an invalid `Host`, a method
//!   or URL override).
//! - A 206 or 416: it is cut for its own request from the whole 200 and
//!   never stored; a plain GET never receives one.
//!
//! What **is** shared, and so must be marked by your handlers:
//!
//! - **A per-user response with `max-age` and no `Vary`.** It is stored and
//!   served to everyone. Add `Cache-Control: private` (then it is never
//!   stored), or `Vary: Cookie` / `Vary: Authorization`, or make the user
//!   part of the key with [`key_header`](CacheLayerBuilder::key_header).
//! - **Anything, with
//!   [`share_uncacheable_with_waiters(true)`](CacheLayerBuilder::share_uncacheable_with_waiters).**
//!   The opt-in hands even a `private` or headerless answer to every request
//!   that waited on the same key. Use it only for endpoints that answer
//!   everyone alike.
//!
//! If you only remember one rule: **per-user responses say `private`.** And
//! the layer goes inside your authentication middleware, never outside it: a
//! hit is answered by the layer, so nothing inside it runs (in axum the
//! layer added last is the outermost: `.layer(cache).layer(auth)`;
//! docs/operations.md, "Where the layer goes", has the diagram).
//!
//! ### How the rules hold
//!
//! - **Waiters** coalesced behind one origin call get its answer only if the
//!   cache could have stored it and served it to them: storable by a shared
//!   cache, accepted by the waiter's own directives, and matching its Vary
//!   values and credentials. Otherwise each waiter calls the origin itself
//!   (under `fallback_limit`).
//!   [`share_uncacheable_with_waiters`](CacheLayerBuilder::share_uncacheable_with_waiters)
//!   opts into giving everyone the same answer; read its hazard first.
//! - **Pass markers:** no answer that is not stored evicts, replaces or
//!   marks an entry other requests may still be served (fresh, or stale
//!   within its grace), in memory or in Redis: any one request (any header,
//!   size, directive or method override) could have caused it. Only a 2xx
//!   or 3xx answer uncacheable for every request of the URL (`no-store`,
//!   `private`, no freshness information, `Vary: *`), with no usable entry
//!   stored, removes what is kept and sets a short pass marker, so later
//!   requests go straight to the origin instead of queueing. An error
//!   status (4xx, 5xx) never sets one. An answer uncacheable because of
//!   its own request (a `Set-Cookie`, the request's credentials, an error
//!   page not stored) goes to that request alone. An error page the cache
//!   could store (a `431` with `max-age=60`) does not replace an entry that
//!   still serves everyone either: it answers the reload that got it, and
//!   the entry is replaced once it expires. The one removal an
//!   unstored answer makes is RFC 9111 §4.4's: a 2xx/3xx to an unsafe
//!   method purges its URL, and the refill after it is coalesced as usual.
//! - **Vary across instances:** every stored variant carries the names and
//!   values it varies on, and the URL's base key in Redis always holds one
//!   variant. An instance that never saw the URL looks the base key up (its
//!   usual single round trip), learns the names from what it finds, and, if
//!   that variant is not its own, looks up its own variant key: at most one
//!   more round trip, once per URL per instance. Until any response varies,
//!   the hit path skips the Vary index entirely. Every entry served, from any
//!   path (hit or flight, memory or Redis, fresh or stale), is compared with
//!   the request's own values first.
//! - **Credentials:** an answer to a request with `Authorization` is reused
//!   for other credentials only when it says `public` or `s-maxage`.
//!   Otherwise (for instance `must-revalidate` alone) it is stored as if it
//!   varied on `Authorization`, and reused only for the same credentials;
//!   only a digest of them is stored. Anonymous and authorized requests
//!   never share entries.
//! - **The key sees what the origin sees:** the host in the key keeps its
//!   port (lowercased), as the origin is told it;
//!   [`key_header`](CacheLayerBuilder::key_header) values are counted and
//!   length-prefixed. Requests the cache builds (the leader's call, a
//!   refresh, a revalidation) carry no `Content-Length` or
//!   `Transfer-Encoding`, and a GET or HEAD that carries a body bypasses the
//!   cache untouched (`Cache-Status: …; fwd=request; detail=request-body`).
//!   A proxy in front should drop hop-by-hop headers before this layer, as
//!   the `reverse_proxy` example does.
//! - **What the key cannot see bypasses it** (never stored, never served
//!   from the cache, never coalesced; `fwd=request` with its own `detail`):
//!   a GET or HEAD whose host RFC 9112 §3.2 / RFC 9113 §8.3.1 calls invalid
//!   (userinfo such as `evil@app.test`, characters or a port outside the
//!   grammar, an empty host, none at all on HTTP/1.1 or later, two `Host`
//!   lines, or a `Host` other than the target's authority: `bad-host`), and
//!   one carrying a method or URL override (`X-HTTP-Method-Override`,
//!   `X-HTTP-Method`, `X-Method-Override`: `method-override`;
//!   `X-Original-URL`, `X-Rewrite-URL`: `url-override`). A valid host with
//!   capitals is lowercased before your service sees it, as the key has it.
//!   Other headers your service reads but the key does not (forwarding
//!   headers above all) must be named with
//!   [`key_header`](CacheLayerBuilder::key_header): see
//!   docs/operations.md, "Hostile requests".
//!
//! ## Bounds and timeouts
//!
//! Every wait, call and buffer has a limit. The timeouts form a ladder, each
//! longer than what it waits for, so a slow but healthy origin never turns
//! the waiters into a herd:
//!
//! ```text
//! Redis reply 250 ms  <  lease 5 s (extended every lease/3 while the call runs)
//!                     <  origin_timeout 60 s   a flight's call, head and body;
//!                                              then its waiters get 504
//!                     <  max_wait = origin_timeout + 5 s   a waiter's wait
//! ```
//!
//! - **Waiters** wait for the flight up to `max_wait`. Only then does one go
//!   to the origin itself, uncached, holding one of `fallback_limit` (64)
//!   permits; if none is free it keeps waiting on the flight, at most one
//!   more `origin_timeout`, and gets the flight's answer (or its 504).
//! - **Calls outside a flight** (waits that ran out, answers a waiter may not
//!   share, misses past the leader cap, [`ReloadMode::Honor`]) each hold a
//!   fallback permit until the response head arrives, and are bounded by
//!   `origin_timeout` (then 504, `detail=origin-timeout`). One that finds the
//!   cap full for a whole `max_wait` is answered 503 with `Retry-After: 1`
//!   (`detail=overloaded`): the one answer the layer makes up itself, when
//!   the origin is already `fallback_limit` calls behind.
//! - **Leader tasks:** at most [`leader_limit`](CacheLayerBuilder::leader_limit)
//!   (1024) flights run at once. A leader whose client went away runs on
//!   (its waiters need it), holding its permit, for at most `origin_timeout`.
//!   A miss with no flight to join past the cap goes to the origin uncached,
//!   under the fallback cap (`detail=overloaded`); it never queues.
//! - **Fill buffers:** at most
//!   [`fill_buffer_bytes`](CacheLayerBuilder::fill_buffer_bytes) (64 MiB)
//!   of bodies are buffered for fills at once, and each at most
//!   `max_body_bytes` (8 MiB). A fill that cannot get budget streams to the
//!   request that started it alone and stores nothing; its waiters go to the
//!   origin themselves, under the fallback cap. A body over `max_body_bytes`
//!   that gets its window is shared as a [streamed fill](#streamed-fills).
//!
//! Every size the API takes or returns is a `usize` count of bytes
//! (`max_body_bytes`, `fill_buffer_bytes`, `capacity_bytes`,
//! `memory_bytes`, `RedisOptions::notice_entry_limit`), as for `Vec::len`:
//! they all bound memory in this process.
//!
//! ## Streamed fills
//!
//! A response body that arrives in more than one frame is read once, by the
//! leader's task, and every request coalesced on that flight in this process
//! reads it as it arrives (shared `Bytes`, one cursor each), under the same
//! rules as a finished answer (storable, Vary and directives match).
//!
//! - **Storable** (up to `max_body_bytes`): every chunk is kept until the
//!   entry is stored; no reader is cut off.
//! - **Too large to store:** one origin call still serves every waiter
//!   present, through a window of at most `max_body_bytes` (plus one
//!   chunk). The slowest reader paces the origin within that window, so
//!   when the machine or the network cannot carry the origin's rate to
//!   every reader, the origin is read at their pace instead of cutting them
//!   off. A reader that holds the fill back is cut off (its body ends with
//!   an error; memory never grows for it) once half the readers have waited
//!   for it three times as long as they spent reading (it is less than a
//!   quarter as fast as most), or once any reader has waited for it 5 s at
//!   a stretch (a stalled client). So one slow client delays the others at
//!   most three times as long as they had been reading, and at most 5 s at
//!   a stretch. Requests that arrive after the first byte has left the
//!   window share one new origin call among themselves (a new flight); one
//!   that finds the start gone only as it attaches calls on its own
//!   (`detail=stream-window-passed`).
//! - **Errors:** an origin error or a stall longer than `origin_timeout`
//!   mid-body ends every reader's body with an error (never silently short)
//!   and stores nothing; the next request elects a new leader. A storable
//!   body must arrive whole within `origin_timeout`; a body too large to
//!   store may take longer (its readers set the pace), and `origin_timeout`
//!   then bounds each wait for the origin's next frame, and each wait for a
//!   reader that makes no progress (that reader is cut off). If the
//!   leader's own client leaves, the fill goes on for the others; if every
//!   reader leaves a body that will not be stored, the origin call is dropped.
//! - **Too large is not uncacheable:** such a fill sets no pass marker, so
//!   the next request after it leads a new shared fill. (A stored entry it
//!   was refreshing stays, served only as its own stale rules allow.)
//! - **Other instances** wait for the stored fill. For a body too large to
//!   store none comes, so the leader's flight ends as soon as it knows
//!   (from `Content-Length`, or when the body passes the limit): its lease
//!   is released, which wakes the waiters elsewhere, and the rest of the
//!   body streams on in a task of its own, still shared with every reader
//!   in this process. Each other instance then makes one origin call for
//!   all its waiters, shared the same way: at most one call per instance.
//!
//! ## Work that must not run twice
//!
//! [`Redlock`] takes a lease on a majority of independent masters, and
//! [`Redlock::run`] runs work under its deadline and writes the result through
//! a [`FencedStore`]. Work past the deadline is abandoned; Redlock without
//! fencing is an efficiency lock, not a correctness guarantee. The layer can
//! use Redlock as its lease backend ([`CacheLayerBuilder::redlock`]). A full
//! example is on [`Redlock`].
//!
//! - Acquisition asks every node in parallel with a per-node timeout far
//!   below the TTL (TTL/100, clamped to 5–50 ms), needs N/2+1 votes, and
//!   computes the validity as TTL − elapsed − (TTL × 0.01 + 2 ms). A failed
//!   or late attempt releases everywhere, then retries after a random delay.
//! - The deadline is the end of validity: work past it is abandoned (`run`
//!   drops it and writes nothing). A watchdog extends the lease on a quorum
//!   every TTL/3 and moves the deadline.
//! - A paused holder, clock drift or a failover that loses the lock can all
//!   produce two holders; the fence token from the resource's own counter is
//!   what keeps the older one from overwriting a newer write.
//!
//! ## Observability
//!
//! Metrics go through the `metrics` facade (`herdguard_requests_total
//! {outcome}`, `herdguard_origin_calls_total`, `herdguard_wait_seconds`,
//! `herdguard_fenced_writes_rejected_total`, `herdguard_corrupt_entries_total`,
//! `herdguard_redis_errors_total{op, class}`, `herdguard_redis_available`, `herdguard_entry_bytes`,
//! `herdguard_lease_remaining_at_release_seconds`,
//! `herdguard_not_stored_total{reason}`,
//! `herdguard_stream_waiter_ttfb_seconds`,
//! `herdguard_stream_readers_cut_off_total`,
//! `redis_lock_acquire_total{result}`, `redis_lock_held_seconds`), each
//! labelled `cache` with the layer's
//! [`cache_name`](CacheLayerBuilder::cache_name); install any
//! recorder (the `metrics` example serves Prometheus). The names are
//! constants in [`metric_names`], and every metric of a layer is registered
//! at 0 when the layer is built (install the recorder first), so
//! dashboards read 0 rather than "no data" before the first request.
//! [`cache_status_header(false)`](CacheLayerBuilder::cache_status_header)
//! logs `Cache-Status` instead of sending it. Each request the layer
//! handles has a `herdguard` span (debug level) with `key`, `outcome`,
//! `lease` (token prefix), `fence` and `wait_ms`; the leader's spawned task
//! carries its request's span. The `herdguard` binary (feature `cli`)
//! inspects entries, locks and clock skew.
//!
//! ## With axum
//!
//! ```
//! use axum::{routing::get, Router};
//! use herdguard::CacheLayer;
//!
//! async fn report() -> ([(&'static str, &'static str); 1], &'static str) {
//!     ([("cache-control", "max-age=5, stale-while-revalidate=30")], "expensive")
//! }
//!
//! let cache = CacheLayer::new();
//! let app: Router = Router::new()
//!     .route("/report/{id}", get(report))
//!     .route("/other", get(report))
//!     // One layer, shared state: coalescing spans both routes.
//!     .layer(cache.clone());
//! # let _ = app;
//! ```
//!
//! ## No default TTL for answers without freshness
//!
//! A handler that sets no `Cache-Control` (as most do) is not cached by
//! default: each request calls it, and the layer says why (the WARN,
//! `detail=no-freshness`). One line turns caching on, for the layer or for
//! one route:
//!
//! ```
//! # use std::time::Duration;
//! let cache = herdguard::CacheLayer::builder()
//!     .default_ttl(Duration::from_secs(5)) // answers without Cache-Control live 5 s
//!     .build()?;
//! # let _ = cache; Ok::<(), herdguard::BuildError>(())
//! ```
//!
//! The library chooses not to default to a short TTL (unlike
//! http-cache-tower-server's 60 s) because an answer without freshness may
//! be made for one user. The key holds the host, path, query, whether
//! `Authorization` is present and the `Vary` values, but not cookies: a
//! `/me` handler that reads a session cookie and sets no headers would,
//! with a default TTL, hand one user's page to the next. An origin that
//! sends `max-age` has said its answer may be shared; silence says nothing,
//! so sharing it is a decision the person who knows the handlers makes,
//! with [`default_ttl`](CacheLayerBuilder::default_ttl) on the layer or
//! [`RoutePolicy::default_ttl`] on the routes whose answers are the same for
//! everyone. (`herdguard proxy`'s `--default-ttl` is the same opt-in.)
//!
//! ## Per-route policy
//!
//! [`CacheLayer::with_policy`] makes a layer for one route with its own
//! [`RoutePolicy`] on the same cache (one store, one Redis client, one set
//! of flights): a key function, a [`Predicate`] on what to store, a TTL for
//! headerless answers, a maximum TTL, and a mode that ignores the origin's
//! freshness directives. Routes whose keys agree coalesce into one origin
//! call; see the example there. A key function only names the resource: the
//! rules of [what is shared between users](#what-is-shared-between-users) still
//! apply on top of it.
//!
//! ## Any request body: a bare hyper server
//!
//! [`CacheService`] takes a `Request<B>` with any body, `hyper::body::Incoming`
//! included, so it can be hyper's service itself (through hyper-util's
//! `TowerToHyperService`). The inner service receives
//! `Request<`[`RequestBody<B>`](RequestBody)`>`: the client's own body where
//! a request goes on as it came, an empty one on the requests the cache
//! builds (a flight's call, refreshes, revalidations). axum's `Router` takes
//! that as it is.
//!
//! ## Cargo features
//!
//! - `redis` (default): the shared store, `RedisOptions`, `Redlock` and
//!   `FencedStore`. Without it (`default-features = false`) the crate is the
//!   in-process cache alone, with the same layer, HTTP rules and single
//!   flight, and none of the Redis dependency tree.
//! - `axum` (default): reads axum's `OriginalUri`, so nested routers never
//!   share a key.
//! - `tls` (implies `redis`): `rediss://` through rustls, and
//!   `RedisOptions::tls_root_cert_pem`.
//! - `cli` (implies `redis`): the `herdguard` diagnostics binary.
//! - `serde`: [`Json<T>`](Json), any serde type as a [`Cache`] value with
//!   no hand-written encoding.
//!
//! ## Without HTTP
//!
//! [`Cache`] is the same engine for any value: see
//! [`Cache::get_or_compute`].

// docs.rs: mark feature-gated items with the feature they need.
#![cfg_attr(docsrs, feature(doc_cfg))]
// The docs describe the Redis paths too; built memory-only, their links to
// Redis items have nothing to point at and stay plain text.
#![cfg_attr(not(feature = "redis"), allow(rustdoc::broken_intra_doc_links))]

mod engine;
mod error;
mod http;
#[cfg(feature = "redis")]
#[doc(hidden)]
pub mod inspect;
mod key;
#[cfg(feature = "redis")]
mod lock;
// Same path as the real leases, so their users need no cfg of their own.
#[cfg(not(feature = "redis"))]
#[path = "lock/no_redis.rs"]
mod lock;
mod metrics;
mod store;

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use engine::Json;
pub use engine::{Cache, CacheBuilder, Freshness, Lookup, Value};
pub use error::{BoxError, BuildError, DecodeError, Error, StoreFailure, StoreFailureKind};
pub use http::body::CacheBody;
pub use http::future::ResponseFuture;
pub use http::layer::{CacheLayer, CacheLayerBuilder};
pub use http::purge::{AsUri, PurgeError, PurgeHandle, Purged};
pub use http::request_body::RequestBody;
pub use http::response::CachedResponse;
pub use http::route::{DefaultPredicate, Predicate, RoutePolicy};
pub use http::service::CacheService;
pub use http::state::ReloadMode;
pub use key::CacheKey;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use lock::redlock::{
    FencedStore, Guarded, LockError, Redlock, RedlockBuilder, RedlockLease, Work,
};
pub use metrics::names as metric_names;
pub use metrics::{describe_metrics, Source, Stats};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use store::redis::RedisOptions;

/// The README's examples, compiled as doctests (some use Redis).
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
