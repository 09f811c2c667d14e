//! Cache-Control freshness and parsing, and the origin `Age` cases.

use crate::harness::*;

/// Mirrors the suite's cc-freshness and cc-parse groups (`freshness-*`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survey_cc_freshness_and_parse() {
    let h = Harness::start().await;
    let one = |id, kind, cc: &str, e: Expect| {
        case(
            id,
            kind,
            vec![step().rh_raw("Cache-Control", cc).setup(), step().expect(e)],
        )
    };
    use Expect::{Cached as C, NotCached as N};
    let cases = vec![
        case(
            "freshness-none",
            Check,
            vec![step().setup(), step().not_cached()],
        ),
        case(
            "freshness-max-age",
            Optimal,
            vec![step().cc("max-age=3600").setup(), step().cached()],
        ),
        case(
            "freshness-max-age-stale",
            Required,
            vec![become_stale(), step().not_cached()],
        ),
        case(
            "freshness-max-age-0",
            Required,
            vec![step().cc("max-age=0").setup(), step().not_cached()],
        ),
        case(
            "freshness-max-age-max-minus-1",
            Optimal,
            vec![step().cc("max-age=2147483647").setup(), step().cached()],
        ),
        case(
            "freshness-max-age-max",
            Optimal,
            vec![step().cc("max-age=2147483648").setup(), step().cached()],
        ),
        case(
            "freshness-max-age-max-plus-1",
            Optimal,
            vec![step().cc("max-age=2147483649").setup(), step().cached()],
        ),
        case(
            "freshness-max-age-max-plus",
            Optimal,
            vec![step().cc("max-age=99999999999").setup(), step().cached()],
        ),
        case(
            "freshness-max-age-age",
            Required,
            vec![
                step()
                    .rh("Date", V::At(0))
                    .cc("max-age=3600")
                    .rh("Age", t("7200"))
                    .setup(),
                step().not_cached(),
            ],
        ),
        case(
            "freshness-max-age-date",
            Check,
            vec![
                step().rh("Date", V::At(-7200)).cc("max-age=3600").setup(),
                step().not_cached(),
            ],
        ),
        case(
            "freshness-max-age-expires",
            Optimal,
            vec![
                step()
                    .cc("max-age=3600")
                    .rh("Expires", V::At(-7200))
                    .rh("Date", V::At(0))
                    .setup(),
                step().cached(),
            ],
        ),
        case(
            "freshness-max-age-expires-invalid",
            Optimal,
            vec![
                step()
                    .cc("max-age=3600")
                    .rh_raw("Expires", "0")
                    .rh("Date", V::At(0))
                    .setup(),
                step().cached(),
            ],
        ),
        case(
            "freshness-max-age-0-expires",
            Required,
            vec![
                step()
                    .rh("Expires", V::At(3600))
                    .cc("max-age=0")
                    .rh("Date", V::At(0))
                    .setup(),
                step().not_cached(),
            ],
        ),
        one(
            "freshness-max-age-extension",
            Optimal,
            "foobar, max-age=3600",
            C,
        ),
        one(
            "freshness-max-age-case-insenstive",
            Optimal,
            "MaX-aGe=3600",
            C,
        ),
        one("freshness-max-age-negative", Required, "max-age=-3600", N),
        one("freshness-s-maxage-shared", Optimal, "s-maxage=3600", C),
        case(
            "freshness-max-age-s-maxage-shared-longer",
            Required,
            vec![
                step().cc("max-age=3600, s-maxage=1").setup().pause(2100),
                step().not_cached(),
            ],
        ),
        case(
            "freshness-max-age-s-maxage-shared-longer-reversed",
            Required,
            vec![
                step().cc("s-maxage=1, max-age=3600").setup().pause(2100),
                step().not_cached(),
            ],
        ),
        case(
            "freshness-max-age-s-maxage-shared-longer-multiple",
            Required,
            vec![
                step()
                    .cc("max-age=3600")
                    .cc("s-maxage=1")
                    .setup()
                    .pause(2100),
                step().not_cached(),
            ],
        ),
        case(
            "freshness-max-age-s-maxage-shared-shorter",
            Optimal,
            vec![
                step().cc("max-age=1, s-maxage=3600").setup().pause(2100),
                step().cached(),
            ],
        ),
        case(
            "freshness-max-age-s-maxage-shared-shorter-expires",
            Optimal,
            vec![
                step()
                    .rh("Expires", V::At(-10))
                    .cc("max-age=0, s-maxage=3600")
                    .setup(),
                step().cached(),
            ],
        ),
        // cc-parse
        one(
            "freshness-max-age-two-fresh-stale-sameline",
            Check,
            "max-age=1800, max-age=1",
            C,
        ),
        case(
            "freshness-max-age-two-fresh-stale-sepline",
            Check,
            vec![
                step()
                    .rh_raw("Cache-Control", "max-age=1800")
                    .rh_raw("Cache-Control", "max-age=1")
                    .setup()
                    .pause(2100),
                step().cached(),
            ],
        ),
        one(
            "freshness-max-age-two-stale-fresh-sameline",
            Check,
            "max-age=1, max-age=1800",
            C,
        ),
        case(
            "freshness-max-age-two-stale-fresh-sepline",
            Check,
            vec![
                step()
                    .rh_raw("Cache-Control", "max-age=1")
                    .rh_raw("Cache-Control", "max-age=1800")
                    .setup()
                    .pause(2100),
                step().cached(),
            ],
        ),
        one("freshness-max-age-quoted", Check, "max-age=\"3600\"", C),
        case(
            "freshness-max-age-ignore-quoted",
            Required,
            vec![
                step()
                    .rh_raw("Cache-Control", "extension=\"max-age=3600\", max-age=1")
                    .setup()
                    .pause(2100),
                step().not_cached(),
            ],
        ),
        case(
            "freshness-max-age-ignore-quoted-rev",
            Required,
            vec![
                step()
                    .rh_raw("Cache-Control", "max-age=1, extension=\"max-age=3600\"")
                    .setup()
                    .pause(2100),
                step().not_cached(),
            ],
        ),
        one(
            "freshness-max-age-space-before-equals",
            Check,
            "max-age =3600",
            N,
        ),
        one(
            "freshness-max-age-space-after-equals",
            Check,
            "max-age= 3600",
            N,
        ),
        one(
            "freshness-max-age-leading-zero",
            Optimal,
            "max-age=003600",
            C,
        ),
        one(
            "freshness-max-age-single-quoted",
            Required,
            "max-age='3600'",
            N,
        ),
        one("freshness-max-age-decimal-zero", Check, "max-age=3600.0", C),
        one("freshness-max-age-decimal-five", Check, "max-age=3600.5", C),
        one("freshness-max-age-a100", Check, "max-age=a3600", C),
        one("freshness-max-age-100a", Check, "max-age=3600a", C),
    ];
    survey(&h, cases, KNOWN_FRESHNESS).await;
}

/// Deviations in the freshness groups, each with its reason.
const KNOWN_FRESHNESS: &[(&str, &str)] = &[
    (
        "freshness-max-age-two-fresh-stale-sameline",
        "check: duplicate max-age is stale (RFC 9111 §4.2.1 allows it; the safe reading)",
    ),
    (
        "freshness-max-age-two-fresh-stale-sepline",
        "check: duplicate max-age is stale",
    ),
    (
        "freshness-max-age-two-stale-fresh-sameline",
        "check: duplicate max-age is stale",
    ),
    (
        "freshness-max-age-two-stale-fresh-sepline",
        "check: duplicate max-age is stale",
    ),
    (
        "freshness-max-age-decimal-zero",
        "check: an invalid max-age is stale, not rounded",
    ),
    (
        "freshness-max-age-decimal-five",
        "check: an invalid max-age is stale, not rounded",
    ),
    (
        "freshness-max-age-a100",
        "check: an invalid max-age is stale",
    ),
    (
        "freshness-max-age-100a",
        "check: an invalid max-age is stale",
    ),
];

/// Mirrors suite tests `freshness-max-age-age` and `age-parse-suffix`: the
/// response fetched for a request keeps the origin's `Age: 7200` (it used to
/// be rewritten to the stored age), and the first value of `Age: 7200, 0`
/// counts, so the response is stale.
#[tokio::test]
async fn origin_age_is_passed_on_and_its_first_value_counts() {
    let age = |v: &str| {
        case(
            "age",
            Required,
            vec![
                step()
                    .rh("Date", V::At(0))
                    .cc("max-age=3600")
                    .rh_raw("Age", v)
                    .setup(),
                step().not_cached(),
            ],
        )
    };
    let mut passthrough = age("7200");
    passthrough.steps[0].resp[2].2 = true;
    assert_eq!(run_one(passthrough).await, Outcome::Pass);
    assert_eq!(run_one(age("7200, 0")).await, Outcome::Pass);
    assert_eq!(run_one(age("7200;foo=bar")).await, Outcome::Pass);
}

/// Mirrors suite tests `freshness-max-age-space-before-equals` and
/// `freshness-max-age-space-after-equals`: whitespace around `=` makes the
/// directive unknown or invalid, so nothing is reused.
#[tokio::test]
async fn whitespace_around_equals_is_not_max_age() {
    for cc in ["max-age =3600", "max-age= 3600", "max-age='3600'"] {
        let c = case(
            "ws",
            Check,
            vec![
                step().rh_raw("Cache-Control", cc).setup(),
                step().not_cached(),
            ],
        );
        assert_eq!(run_one(c).await, Outcome::Pass, "{cc}");
    }
    let quoted = case(
        "quoted",
        Check,
        vec![
            step().rh_raw("Cache-Control", "max-age=\"3600\"").setup(),
            step().cached(),
        ],
    );
    assert_eq!(run_one(quoted).await, Outcome::Pass);
}
