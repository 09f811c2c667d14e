//! The cdn-cache-control group (RFC 9213), and unknown methods.

use crate::harness::*;

/// Mirrors the suite's cdn-cache-control group (RFC 9213): every case, with
/// the suite's kinds (a case without a kind is required).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survey_cdn_cache_control() {
    let h = Harness::start().await;
    let cdn = |v: &str| step().rh_raw("CDN-Cache-Control", v);
    let cached = |id, kind, s: Step| case(id, kind, vec![s.setup(), step().cached()]);
    let not_cached = |id, kind, s: Step| case(id, kind, vec![s.setup(), step().not_cached()]);
    let cases = vec![
        cached("cdn-max-age", Optimal, cdn("max-age=3600")),
        cached("cdn-max-age-max", Optimal, cdn("max-age=2147483648")),
        cached("cdn-max-age-max-plus", Optimal, cdn("max-age=99999999999")),
        not_cached(
            "cdn-max-age-age",
            Required,
            cdn("max-age=3600")
                .rh("Date", V::At(0))
                .rh("Age", t("7200")),
        ),
        not_cached(
            "cdn-max-age-space-before-equals",
            Check,
            step()
                .cc("max-age=1")
                .rh_raw("CDN-Cache-Control", "max-age =100")
                .pause(2100),
        ),
        not_cached(
            "cdn-max-age-space-after-equals",
            Check,
            step()
                .cc("max-age=1")
                .rh_raw("CDN-Cache-Control", "max-age= 100")
                .pause(2100),
        ),
        not_cached("cdn-max-age-0", Required, cdn("max-age=0")),
        cached(
            "cdn-max-age-extension",
            Optimal,
            cdn("foobar, max-age=3600"),
        ),
        cached("cdn-max-age-case-insensitive", Check, cdn("MaX-aGe=3600")),
        cached(
            "cdn-max-age-expires",
            Optimal,
            cdn("max-age=3600")
                .rh("Expires", V::At(-10000))
                .rh("Date", V::At(0)),
        ),
        cached(
            "cdn-max-age-cc-max-age-invalid-expires",
            Optimal,
            cdn("max-age=3600")
                .rh_raw("Expires", "0")
                .rh("Date", V::At(0)),
        ),
        not_cached(
            "cdn-max-age-0-expires",
            Required,
            cdn("max-age=0")
                .rh("Expires", V::At(10000))
                .rh("Date", V::At(0)),
        ),
        cached(
            "cdn-max-age-short-cc-max-age",
            Optimal,
            step()
                .cc("max-age=1")
                .rh_raw("CDN-Cache-Control", "max-age=3600")
                .pause(2100),
        ),
        not_cached(
            "cdn-max-age-long-cc-max-age",
            Required,
            step()
                .cc("max-age=3600")
                .rh_raw("CDN-Cache-Control", "max-age=1")
                .pause(2100),
        ),
        not_cached(
            "cdn-private",
            Required,
            step()
                .rh("CDN-Cache-Control", t("private"))
                .cc("max-age=10000")
                .rh("Expires", V::At(10000))
                .rh("Date", V::At(0)),
        ),
        not_cached(
            "cdn-no-cache",
            Required,
            step()
                .rh("CDN-Cache-Control", t("no-cache"))
                .cc("max-age=10000")
                .rh("Expires", V::At(10000))
                .rh("Date", V::At(0)),
        ),
        not_cached(
            "cdn-no-store-cc-fresh",
            Required,
            step()
                .cc("max-age=10000")
                .rh_raw("CDN-Cache-Control", "no-store")
                .rh("Expires", V::At(10000))
                .rh("Date", V::At(0)),
        ),
        cached(
            "cdn-fresh-cc-nostore",
            Required,
            step()
                .cc("no-store")
                .rh_raw("CDN-Cache-Control", "max-age=10000"),
        ),
        not_cached(
            "cdn-cc-invalid-sh-type-unknown",
            Required,
            cdn("max-age=10000, &&&&&").cc("no-store"),
        ),
        not_cached(
            "cdn-cc-invalid-sh-type-wrong",
            Required,
            cdn("max-age=\"10000\"").cc("no-store"),
        ),
        case(
            "cdn-remove-header",
            Check,
            vec![step()
                .cc("max-age=10000")
                .rh_raw("CDN-Cache-Control", "foo")
                .rh("Expires", V::At(10000))
                .rh("Date", V::At(0))
                .header_is("CDN-Cache-Control", t("foo"))],
        ),
    ];
    survey(&h, cases, KNOWN_CDN).await;
}

const KNOWN_CDN: &[(&str, &str)] = &[(
    "cdn-max-age-case-insensitive",
    "check: Dictionary keys are lowercase (RFC 9651), so `MaX-aGe` fails to parse and the field is ignored",
)];

/// Mirrors suite tests `invalidate-M-SEARCH`, `invalidate-M-SEARCH-location`
/// and `invalidate-M-SEARCH-cl`: a method of unknown safety invalidates the
/// target URI and its Location / Content-Location like POST does.
#[tokio::test]
async fn unknown_method_invalidates() {
    let c = case(
        "msearch",
        Required,
        vec![
            fresh(),
            step().method("M-SEARCH").setup(),
            step().not_cached(),
        ],
    );
    assert_eq!(run_one(c).await, Outcome::Pass);
    let mut lcl = step()
        .method("M-SEARCH")
        .rh("Location", t("location_target"))
        .setup();
    lcl.magic_locations = true;
    let target = || step().file("location_target").cc("max-age=100000");
    let c = case(
        "msearch-loc",
        Check,
        vec![target().setup(), lcl, target().not_cached()],
    );
    assert_eq!(run_one(c).await, Outcome::Pass);
}
