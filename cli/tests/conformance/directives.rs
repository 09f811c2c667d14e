//! Response directives and status codes.

use crate::harness::*;

/// Mirrors the suite's cc-response, status, cc-request and pragma groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survey_directives_and_status() {
    let h = Harness::start().await;
    let mut cases = vec![
        case(
            "cc-resp-private-shared",
            Required,
            vec![
                step().cc("private, max-age=3600").setup(),
                step().not_cached(),
            ],
        ),
        case(
            "cc-resp-no-store",
            Required,
            vec![step().cc("no-store").setup(), step().not_cached()],
        ),
        case(
            "cc-resp-no-store-case-insensitive",
            Required,
            vec![step().cc("No-StOrE").setup(), step().not_cached()],
        ),
        case(
            "cc-resp-no-store-fresh",
            Required,
            vec![
                step()
                    .cc("max-age=10000, no-store")
                    .rh("Expires", V::At(10000))
                    .rh("Date", V::At(0))
                    .setup(),
                step().not_cached(),
            ],
        ),
        case(
            "cc-resp-no-cache",
            Required,
            vec![
                step()
                    .cc("max-age=10000, no-cache")
                    .rh("Expires", V::At(10000))
                    .rh("Date", V::At(0))
                    .setup(),
                step().not_cached(),
            ],
        ),
        case(
            "cc-resp-no-cache-revalidate",
            Optimal,
            vec![
                step().cc("no-cache").rh("ETag", t("\"abcd\"")).setup(),
                step().expect(Expect::EtagValidated),
            ],
        ),
        case(
            "cc-resp-no-cache-revalidate-fresh",
            Optimal,
            vec![
                step()
                    .cc("max-age=10000, no-cache")
                    .rh("Expires", V::At(10000))
                    .rh("Date", V::At(0))
                    .rh("ETag", t("\"abcd\""))
                    .setup(),
                step().expect(Expect::EtagValidated),
            ],
        ),
        case(
            "cc-resp-must-revalidate-fresh",
            Optimal,
            vec![
                step()
                    .cc("max-age=10000, must-revalidate")
                    .rh("ETag", t("\"abcd\""))
                    .setup(),
                step().cached(),
            ],
        ),
        // The suite's max-age=2 left step 2 about a second to be served
        // fresh (Date has whole seconds); see `SLACK_MAX_AGE`.
        case(
            "cc-resp-must-revalidate-stale",
            Required,
            vec![
                step()
                    .cc(&format!("max-age={SLACK_MAX_AGE}, must-revalidate"))
                    .rh("ETag", t("\"abcd\""))
                    .setup(),
                step()
                    .cc(&format!("max-age={SLACK_MAX_AGE}, must-revalidate"))
                    .rh("ETag", t("\"abcd\""))
                    .cached()
                    .setup()
                    .slack_stale_pause(),
                step().expect(Expect::EtagValidated),
            ],
        ),
        case(
            "headers-omit-headers-listed-in-Cache-Control-no-cache-single",
            Check,
            vec![
                step()
                    .cc("no-cache=\"a\"")
                    .rh("a", t("1"))
                    .rh("b", t("2"))
                    .cc("max-age=3600")
                    .rh("Date", V::At(0))
                    .setup(),
                step()
                    .cached()
                    .header_is("b", t("2"))
                    .missing("a")
                    .setup_checks(&["expected_type"]),
            ],
        ),
        case(
            "status-599-must-understand",
            Required,
            vec![
                step()
                    .status(599)
                    .cc("max-age=3600, no-store, must-understand")
                    .setup(),
                step().not_cached().status(599),
            ],
        ),
        case(
            "status-200-must-understand",
            Optimal,
            vec![
                step().cc("max-age=3600, no-store, must-understand").setup(),
                step().cached(),
            ],
        ),
        // cc-request
        case(
            "ccreq-ma0",
            Check,
            vec![
                fresh().setup(),
                step().q("Cache-Control", t("max-age=0")).not_cached(),
            ],
        ),
        case(
            "ccreq-ma1",
            Check,
            vec![
                fresh().setup().pause(2100),
                step().q("Cache-Control", t("max-age=1")).not_cached(),
            ],
        ),
        case(
            "ccreq-magreaterage",
            Check,
            vec![
                step().cc("max-age=3600").rh("Age", t("1800")).setup(),
                step().q("Cache-Control", t("max-age=600")).not_cached(),
            ],
        ),
        // The suite's max-age=1 is stale on arrival (so not stored, see
        // `ccreq-max-stale-age`) whenever the Date's lost fraction of a
        // second plus the trip to the proxy reaches 1 s; see `SLACK_MAX_AGE`.
        case(
            "ccreq-max-stale",
            Check,
            vec![
                step()
                    .cc(&format!("max-age={SLACK_MAX_AGE}"))
                    .setup()
                    .slack_stale_pause(),
                step().q("Cache-Control", t("max-stale=1000")).cached(),
            ],
        ),
        case(
            "ccreq-max-stale-age",
            Check,
            vec![
                step().cc("max-age=1500").rh("Age", t("2000")).setup(),
                step().q("Cache-Control", t("max-stale=1000")).cached(),
            ],
        ),
        case(
            "ccreq-min-fresh",
            Check,
            vec![
                step().cc("max-age=1500").setup(),
                step().q("Cache-Control", t("min-fresh=2000")).not_cached(),
            ],
        ),
        case(
            "ccreq-min-fresh-age",
            Check,
            vec![
                step().cc("max-age=1500").rh("Age", t("1000")).setup(),
                step().q("Cache-Control", t("min-fresh=1000")).not_cached(),
            ],
        ),
        case(
            "ccreq-no-cache",
            Check,
            vec![
                step().cc("max-age=3600").setup(),
                step().q("Cache-Control", t("no-cache")).not_cached(),
            ],
        ),
        case(
            "ccreq-no-cache-lm",
            Check,
            vec![
                step()
                    .cc("max-age=3600")
                    .rh("Last-Modified", V::At(-10000))
                    .rh("Date", V::At(0))
                    .setup(),
                step()
                    .q("Cache-Control", t("no-cache"))
                    .expect(Expect::LmValidated),
            ],
        ),
        case(
            "ccreq-no-cache-etag",
            Check,
            vec![
                step().cc("max-age=3600").rh("ETag", t("\"abc\"")).setup(),
                step()
                    .q("Cache-Control", t("no-cache"))
                    .expect(Expect::EtagValidated),
            ],
        ),
        case(
            "ccreq-no-store",
            Check,
            vec![
                step().cc("max-age=3600").setup(),
                step().q("Cache-Control", t("no-store")).not_cached(),
            ],
        ),
        case(
            "ccreq-oic",
            Check,
            vec![step()
                .q("Cache-Control", t("only-if-cached"))
                .status_is(504)
                .no_body_check()],
        ),
        // pragma
        case(
            "pragma-request-no-cache",
            Check,
            vec![
                step().cc("max-age=3600").setup(),
                step().q("Pragma", t("no-cache")).cached(),
            ],
        ),
        case(
            "pragma-request-extension",
            Check,
            vec![
                step().cc("max-age=3600").setup(),
                step().q("Pragma", t("unrecognised-extension")).cached(),
            ],
        ),
        case(
            "pragma-response-no-cache",
            Check,
            vec![
                step()
                    .cc("max-age=3600")
                    .rh("Pragma", t("no-cache"))
                    .setup(),
                step().cached(),
            ],
        ),
        case(
            "pragma-response-extension",
            Check,
            vec![
                step()
                    .cc("max-age=3600")
                    .rh("Pragma", t("unrecognised-extension"))
                    .setup(),
                step().cached(),
            ],
        ),
    ];
    for code in [
        200, 203, 204, 299, 301, 302, 303, 307, 308, 400, 404, 410, 499, 500, 502, 503, 504, 599,
    ] {
        let id_fresh: &'static str = Box::leak(format!("status-{code}-fresh").into_boxed_str());
        let id_stale: &'static str = Box::leak(format!("status-{code}-stale").into_boxed_str());
        let body = if code == 204 {
            None
        } else {
            Some(format!("body-{code}"))
        };
        let with = |mut s: Step| {
            s.body = body.clone();
            s.status(code)
        };
        cases.push(case(
            id_fresh,
            Optimal,
            vec![with(fresh()), with(step()).cached()],
        ));
        let mut second = step().not_cached();
        second.body = body.clone();
        cases.push(case(
            id_stale,
            Required,
            vec![with(stale()).setup(), second],
        ));
    }
    survey(&h, cases, KNOWN_DIRECTIVES).await;
}

const KNOWN_DIRECTIVES: &[(&str, &str)] = &[
    ("headers-omit-headers-listed-in-Cache-Control-no-cache-single", "check: no-cache=\"a\" is read as a plain no-cache (conservative)"),
    ("ccreq-max-stale-age", "check: a response stale on arrival without validators is not stored, so max-stale cannot use it"),
];

/// Mirrors suite tests `status-200-must-understand` and
/// `status-599-must-understand`: must-understand overrides no-store for a
/// status we know (200), and stores nothing for one we do not (599).
#[tokio::test]
async fn must_understand_overrides_no_store_only_for_known_statuses() {
    let cc = "max-age=3600, no-store, must-understand";
    let known = case(
        "mu200",
        Optimal,
        vec![step().cc(cc).setup(), step().cached()],
    );
    assert_eq!(run_one(known).await, Outcome::Pass);
    let unknown = case(
        "mu599",
        Required,
        vec![
            step().status(599).cc(cc).setup(),
            step().status(599).not_cached(),
        ],
    );
    assert_eq!(run_one(unknown).await, Outcome::Pass);
}

/// Mirrors suite tests `freshness-expires-ansi-c`,
/// `freshness-expires-wrong-case-{weekday,month,tz}` and
/// `freshness-expires-invalid-utc`: letter case and a wrong weekday do not
/// invalidate an Expires date; a wrong time zone does.
#[tokio::test]
async fn lenient_expires_dates() {
    let exp = |v: &str, e: Expect| {
        case(
            "exp",
            Optimal,
            vec![
                step().rh_raw("Expires", v).rh("Date", V::At(0)).setup(),
                step().expect(e),
            ],
        )
    };
    for v in [
        "Thu Aug  8 02:01:18 2050",
        "THU, 18 Aug 2050 02:01:18 GMT",
        "Thu, 18 AUG 2050 02:01:18 GMT",
        "Thu, 18 Aug 2050 02:01:18 gMT",
    ] {
        assert_eq!(run_one(exp(v, Expect::Cached)).await, Outcome::Pass, "{v}");
    }
    for v in [
        "Thu, 18 Aug 2050 02:01:18 UTC",
        "Thu, 18 Aug 50 02:01:18 GMT",
    ] {
        assert_eq!(
            run_one(exp(v, Expect::NotCached)).await,
            Outcome::Pass,
            "{v}"
        );
    }
}
