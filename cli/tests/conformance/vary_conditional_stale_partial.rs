//! Vary, conditional requests, invalidation, headers, stale, partial content and other groups.

use crate::harness::*;

/// The suite's partial-store-partial set-up: a Range request the origin
/// answers with a 206 carrying `content_range` and five bytes.
fn partial_setup(content_range: &str) -> Step {
    step()
        .q("Range", t("bytes=-5"))
        .status(206)
        .cc("max-age=3600")
        .rh_raw("Content-Range", content_range)
        .body("01234")
        .setup()
}

/// Mirrors the suite's vary, vary-parse, conditional, invalidation, stale,
/// partial, headers and other groups (representative cases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survey_vary_conditional_invalidation_stale_other() {
    let h = Harness::start().await;
    let vary_setup_with = |foo: &str| {
        step()
            .q("Foo", t(foo))
            .cc("max-age=5000")
            .rh("Last-Modified", V::At(-3000))
            .rh("Date", V::At(0))
            .rh("Vary", t("Foo"))
            .setup()
    };
    let vary_setup = || vary_setup_with("1");
    let vary_parse = |id, v: &str| {
        case(
            id,
            Required,
            vec![
                step()
                    .q("Foo", t("1"))
                    .cc("max-age=5000")
                    .rh_raw("Vary", v)
                    .setup(),
                step().q("Foo", t("1")).not_cached(),
            ],
        )
    };
    let mut cases = vec![
        case(
            "vary-match",
            Optimal,
            vec![vary_setup(), step().q("Foo", t("1")).cached()],
        ),
        case(
            "vary-no-match",
            Required,
            vec![vary_setup(), step().q("Foo", t("2")).not_cached()],
        ),
        case(
            "vary-omit-stored",
            Required,
            vec![
                step().cc("max-age=5000").rh("Vary", t("Foo")).setup(),
                step().q("Foo", t("1")).not_cached(),
            ],
        ),
        case(
            "vary-omit",
            Required,
            vec![vary_setup(), step().not_cached()],
        ),
        case(
            "vary-invalidate",
            Optimal,
            vec![
                vary_setup().body("foo_1"),
                vary_setup().q("Foo", t("2")).body("foo_2").not_cached(),
                step().q("Foo", t("1")).body("foo_1").cached(),
            ],
        ),
        case(
            "vary-cache-key",
            Optimal,
            vec![
                vary_setup().q("Other", t("2")),
                step().q("Foo", t("1")).q("Other", t("3")).cached(),
            ],
        ),
        case(
            "vary-star",
            Required,
            vec![
                step().cc("max-age=5000").rh("Vary", t("*")).setup(),
                step().not_cached(),
            ],
        ),
        vary_parse("vary-syntax-star-star", "*, *"),
        vary_parse("vary-syntax-empty-star", ", *"),
        vary_parse("vary-syntax-star-foo", "*, Foo"),
        vary_parse("vary-syntax-foo-star", "Foo, *"),
        case(
            "vary-normalise-combine",
            Optimal,
            vec![
                vary_setup_with("1, 2"),
                step().q("Foo", t("1")).q("Foo", t("2")).cached(),
            ],
        ),
        case(
            "vary-normalise-space",
            Optimal,
            vec![
                vary_setup_with("1,2"),
                step().q("Foo", t(" 1, 2 ")).cached(),
            ],
        ),
        case(
            "vary-normalise-lang-order",
            Optimal,
            vec![
                step()
                    .q("Accept-Language", t("en, de"))
                    .cc("max-age=5000")
                    .rh("Last-Modified", V::At(-3000))
                    .rh("Date", V::At(0))
                    .rh("Vary", t("Accept-Language"))
                    .setup(),
                step().q("Accept-Language", t("de, en")).cached(),
            ],
        ),
        // conditional
        case(
            "conditional-etag-strong-respond",
            Optimal,
            vec![
                fresh().rh("ETag", t("\"abcdef\"")),
                step()
                    .q("If-None-Match", t("\"abcdef\""))
                    .cached()
                    .status_is(304)
                    .header_is("ETag", t("\"abcdef\"")),
            ],
        ),
        case(
            "conditional-etag-precedence",
            Required,
            vec![
                fresh()
                    .rh("Last-Modified", V::At(-5000))
                    .rh("ETag", t("\"abcdef\"")),
                step()
                    .q("If-None-Match", t("\"abcdef\""))
                    .q("If-Modified-Since", V::At(-3600 * 24 * 365))
                    .cached()
                    .status_is(304),
            ],
        ),
        case(
            "conditional-etag-weak-respond",
            Optimal,
            vec![
                fresh().rh("ETag", t("W/\"abcdef\"")),
                step()
                    .q("If-None-Match", t("W/\"abcdef\""))
                    .cached()
                    .status_is(304),
            ],
        ),
        case(
            "conditional-etag-strong-respond-multiple-second",
            Optimal,
            vec![
                fresh().rh("ETag", t("\"abcdef\"")),
                step()
                    .q("If-None-Match", t("\"1234\", \"abcdef\", \"5678\""))
                    .cached()
                    .status_is(304),
            ],
        ),
        case(
            "conditional-etag-vary-headers",
            Required,
            vec![
                step()
                    .q("Abc", t("123"))
                    .rh("Expires", V::At(1))
                    .rh("ETag", t("\"abcdef\""))
                    .rh("Date", V::At(0))
                    .rh("Vary", t("Abc"))
                    .setup()
                    .stale_pause(),
                step()
                    .q("Abc", t("123"))
                    .expect(Expect::EtagValidated)
                    .req_header_is("Abc", "123")
                    .setup_checks(&["expected_type"]),
            ],
        ),
        case(
            "conditional-etag-strong-generate",
            Optimal,
            vec![
                become_stale().rh("ETag", t("\"abcdef\"")),
                step()
                    .req_header_is("If-None-Match", "\"abcdef\"")
                    .expect(Expect::EtagValidated),
            ],
        ),
        case(
            "conditional-lm-fresh",
            Optimal,
            vec![
                step()
                    .cc("max-age=100000")
                    .rh("Last-Modified", V::At(-3000))
                    .rh("Date", V::At(0))
                    .setup(),
                step()
                    .q("If-Modified-Since", V::At(-3000))
                    .cached()
                    .status_is(304),
            ],
        ),
        case(
            "conditional-lm-stale",
            Optimal,
            vec![
                step()
                    .cc("max-age=2")
                    .rh("Last-Modified", V::At(-3000))
                    .rh("Date", V::At(0))
                    .setup()
                    .stale_pause(),
                step()
                    .q("If-Modified-Since", V::At(-3002))
                    .expect(Expect::LmValidated)
                    .status_is(304),
            ],
        ),
        case(
            "304-lm-use-stored-Test-Header",
            Required,
            vec![
                step()
                    .cc("max-age=2")
                    .rh("Last-Modified", t("Wed, 01 Jan 2020 00:00:00 GMT"))
                    .rh("Date", V::At(0))
                    .rh("Test-Header", t("A"))
                    .setup()
                    .stale_pause(),
                step()
                    .rh("Last-Modified", t("Wed, 01 Jan 2020 00:00:00 GMT"))
                    .rh("Date", V::At(0))
                    .expect(Expect::LmValidated)
                    .header_is("Test-Header", t("A"))
                    .setup_checks(&["expected_type"]),
            ],
        ),
        // headers
        case(
            "headers-omit-headers-listed-in-Connection",
            Required,
            vec![
                fresh()
                    .rh_raw("Connection", "a, b")
                    .rh_raw("a", "1")
                    .rh_raw("b", "2")
                    .rh_raw("c", "3"),
                step()
                    .cached()
                    .header_is("c", t("3"))
                    .missing("a")
                    .missing("b")
                    .setup_checks(&["expected_type", "expected_response_headers"]),
            ],
        ),
        // stale
        case(
            "stale-while-revalidate",
            Optimal,
            vec![
                step()
                    .cc("max-age=1, stale-while-revalidate=3600")
                    .rh("ETag", t("\"abc\""))
                    .setup()
                    .pause(2100),
                step().cached(),
            ],
        ),
        case(
            "stale-sie-close",
            Check,
            vec![
                step()
                    .cc("max-age=2, stale-if-error=60")
                    .setup()
                    .stale_pause(),
                step().disconnect().cached(),
            ],
        ),
        case(
            "stale-503",
            Check,
            vec![become_stale(), step().status(503).status_is(200).cached()],
        ),
        // partial
        case(
            "partial-store-complete-reuse-partial",
            Optimal,
            vec![
                step().cc("max-age=3600").body("01234567890").setup(),
                step()
                    .q("Range", t("bytes=0-1"))
                    .cached()
                    .status_is(206)
                    .text_is("01"),
            ],
        ),
        case(
            "partial-store-complete-reuse-partial-no-last",
            Optimal,
            vec![
                step().cc("max-age=3600").body("01234567890").setup(),
                step()
                    .q("Range", t("bytes=1-"))
                    .cached()
                    .status_is(206)
                    .text_is("1234567890"),
            ],
        ),
        case(
            "partial-store-complete-reuse-partial-suffix",
            Optimal,
            vec![
                step().cc("max-age=3600").body("0123456789A").setup(),
                step()
                    .q("Range", t("bytes=-1"))
                    .cached()
                    .status_is(206)
                    .text_is("A"),
            ],
        ),
        case(
            "partial-store-partial-reuse-partial",
            Optimal,
            vec![
                partial_setup("bytes 4-9/10").req_header_is("Range", "bytes=-5"),
                step()
                    .q("Range", t("bytes=-5"))
                    .cached()
                    .status_is(206)
                    .text_is("01234"),
            ],
        ),
        case(
            "partial-store-partial-reuse-partial-byterange",
            Optimal,
            vec![
                partial_setup("bytes 4-9/10"),
                step()
                    .q("Range", t("bytes=6-8"))
                    .cached()
                    .status_is(206)
                    .text_is("234"),
            ],
        ),
        case(
            "partial-store-partial-reuse-partial-absent",
            Optimal,
            vec![
                partial_setup("bytes 4-9/10"),
                step()
                    .q("Range", t("bytes=6-"))
                    .cached()
                    .status_is(206)
                    .text_is("234"),
            ],
        ),
        case(
            "partial-store-partial-reuse-partial-suffix",
            Optimal,
            vec![
                partial_setup("bytes 4-9/10"),
                step()
                    .q("Range", t("bytes=-1"))
                    .cached()
                    .status_is(206)
                    .text_is("4"),
            ],
        ),
        case(
            "partial-store-partial-complete",
            Optimal,
            vec![
                partial_setup("bytes 0-4/10"),
                step().req_header_is("Range", "bytes=5-"),
            ],
        ),
        case(
            "partial-use-stored-headers",
            Required,
            vec![
                step()
                    .cc("max-age=3600")
                    .rh("A", t("1"))
                    .body("01234567890")
                    .setup(),
                step()
                    .q("Range", t("bytes=0-1"))
                    .cached()
                    .status_is(206)
                    .text_is("01")
                    .header_is("A", t("1"))
                    .setup_checks(&["expected_type", "expected_status", "expected_response_text"]),
            ],
        ),
        // other
        case(
            "other-age-gen",
            Required,
            vec![fresh().pause(2100), step().cached()],
        ),
        case(
            "other-date-update",
            Required,
            vec![fresh(), step().cached().header_is("Date", V::At(0))],
        ),
        case(
            "query-args-different",
            Required,
            vec![fresh(), {
                let mut s = step().not_cached();
                s.query = Some("test=2".into());
                s
            }],
        ),
        case(
            "other-authorization",
            Required,
            vec![
                fresh().q("Authorization", t("FOO")),
                step().q("Authorization", t("FOO")).not_cached(),
            ],
        ),
        case(
            "other-authorization-public",
            Optimal,
            vec![
                fresh().cc("public").q("Authorization", t("FOO")),
                step().q("Authorization", t("FOO")).cached(),
            ],
        ),
        case(
            "other-set-cookie",
            Optimal,
            vec![fresh().rh("Set-Cookie", t("a=b")), step().cached()],
        ),
        case(
            "other-cookie",
            Optimal,
            vec![fresh(), step().q("Cookie", t("a=b")).cached()],
        ),
        case(
            "head-writethrough",
            Check,
            vec![fresh().method("HEAD").setup(), {
                let mut s = step().method("HEAD").not_cached();
                s.expect_method = Some("HEAD");
                s
            }],
        ),
    ];
    if let Some(c) = cases.iter_mut().find(|c| c.id == "other-age-gen") {
        c.steps[1].expect_age_over = Some(1);
    }
    for m in ["POST", "PUT", "DELETE", "M-SEARCH"] {
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        cases.push(case(
            leak(format!("invalidate-{m}")),
            Required,
            vec![fresh(), step().method(m).setup(), step().not_cached()],
        ));
        cases.push(case(
            leak(format!("invalidate-{m}-failed")),
            Optimal,
            vec![
                fresh(),
                step().method(m).status(500).setup(),
                step().cached(),
            ],
        ));
        let target = |f: &'static str| {
            step()
                .file(f)
                .cc("max-age=100000")
                .rh("Last-Modified", V::At(0))
                .rh("Date", V::At(0))
        };
        let lcl = || {
            let mut s = step()
                .method(m)
                .rh("Location", t("location_target"))
                .rh("Content-Location", t("content_location_target"))
                .setup();
            s.magic_locations = true;
            s
        };
        cases.push(case(
            leak(format!("invalidate-{m}-location")),
            Check,
            vec![
                target("location_target").setup(),
                lcl(),
                target("location_target").not_cached(),
            ],
        ));
        cases.push(case(
            leak(format!("invalidate-{m}-cl")),
            Check,
            vec![
                target("content_location_target").setup(),
                lcl(),
                target("content_location_target").not_cached(),
            ],
        ));
    }
    survey(&h, cases, KNOWN_OTHER).await;
}

const KNOWN_OTHER: &[(&str, &str)] = &[
    (
        "stale-503",
        "check: stale is served for a 5xx only when stale-if-error allows it",
    ),
    (
        "partial-store-partial-reuse-partial",
        "optimal: a 206 is never stored (docs/operations.md, No partial entries); and it expects the client's Range forwarded on the miss, which the whole-object fill shared with plain GETs never does",
    ),
    (
        "partial-store-partial-reuse-partial-byterange",
        "optimal: a 206 is never stored; and its 5 bytes under `bytes 4-9/10` (6) give `234` for 6-8 only if counted from the front",
    ),
    (
        "partial-store-partial-reuse-partial-absent",
        "optimal: a 206 is never stored; and its 5 bytes under `bytes 4-9/10` (6) disagree with their label",
    ),
    (
        "partial-store-partial-reuse-partial-suffix",
        "optimal: a 206 is never stored; and its 5 bytes under `bytes 4-9/10` (6) give `4` for -1 only if counted from the back, against -byterange",
    ),
    (
        "partial-store-partial-complete",
        "optimal: a 206 is never stored (docs/operations.md, No partial entries), so there is nothing to complete with `Range: bytes=5-`",
    ),
    (
        "other-set-cookie",
        "optimal: responses with Set-Cookie are never stored (DESIGN.md)",
    ),
    (
        "head-writethrough",
        "check: a HEAD miss is filled with a GET so the entry serves both",
    ),
];
