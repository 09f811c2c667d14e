//! `Age` and `Expires`.

use crate::harness::*;

/// Mirrors the suite's age-parse, expires-freshness and expires-parse groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survey_age_and_expires() {
    let h = Harness::start().await;
    let age = |id, v: &str, e: Expect| {
        case(
            id,
            Required,
            vec![
                step()
                    .rh("Date", V::At(0))
                    .cc("max-age=3600")
                    .rh_raw("Age", v)
                    .setup(),
                step().expect(e),
            ],
        )
    };
    let age2 = |id, a: &str, b: &str, e: Expect| {
        case(
            id,
            Required,
            vec![
                step()
                    .rh("Date", V::At(0))
                    .cc("max-age=3600")
                    .rh_raw("Age", a)
                    .rh_raw("Age", b)
                    .setup(),
                step().expect(e),
            ],
        )
    };
    let exp = |id, kind, v: &str, e: Expect| {
        case(
            id,
            kind,
            vec![
                step().rh_raw("Expires", v).rh("Date", V::At(0)).setup(),
                step().expect(e),
            ],
        )
    };
    use Expect::{Cached as C, NotCached as N};
    let cases = vec![
        age("age-parse-nonnumeric", "abc", C),
        age("age-parse-negative", "-7200", C),
        age("age-parse-float", "7200.0", C),
        age("age-parse-large-minus-one", "2147483647", N),
        age("age-parse-large", "2147483648", N),
        age("age-parse-larger", "2147483649", N),
        age("age-parse-suffix", "7200, 0", N),
        age("age-parse-prefix", "0, 7200", C),
        age2("age-parse-suffix-twoline", "7200", "0", N),
        age2("age-parse-prefix-twoline", "0", "7200", C),
        age("age-parse-dup-0", "0, 0", C),
        age2("age-parse-dup-0-twoline", "0", "0", C),
        case(
            "age-parse-dup-old",
            Required,
            vec![
                step()
                    .rh("Date", V::At(0))
                    .cc("max-age=10000")
                    .rh_raw("Age", "3600")
                    .rh_raw("Age", "3600")
                    .setup(),
                step().cached(),
            ],
        ),
        {
            let mut c = age("age-parse-parameter", "7200;foo=bar", N);
            c.kind = Check;
            c
        },
        {
            let mut c = age("age-parse-numeric-parameter", "7200;foo=111", N);
            c.kind = Check;
            c
        },
        // expires-freshness
        case(
            "freshness-expires-future",
            Optimal,
            vec![
                step()
                    .rh("Expires", V::At(30 * 24 * 3600))
                    .rh("Date", V::At(0))
                    .setup(),
                step().cached(),
            ],
        ),
        case(
            "freshness-expires-past",
            Required,
            vec![
                step()
                    .rh("Expires", V::At(-30 * 24 * 3600))
                    .rh("Date", V::At(0))
                    .setup(),
                step().not_cached(),
            ],
        ),
        case(
            "freshness-expires-present",
            Required,
            vec![
                step().rh("Expires", V::At(0)).rh("Date", V::At(0)).setup(),
                step().not_cached(),
            ],
        ),
        case(
            "freshness-expires-old-date",
            Required,
            vec![
                step()
                    .rh("Expires", V::At(300))
                    .rh("Date", V::At(400))
                    .setup(),
                step().not_cached(),
            ],
        ),
        exp("freshness-expires-invalid", Required, "0", N),
        case(
            "freshness-expires-invalid-date",
            Optimal,
            vec![
                step()
                    .rh_raw("Date", "foo")
                    .rh("Expires", V::At(10))
                    .setup(),
                step().cached(),
            ],
        ),
        case(
            "freshness-expires-age-slow-date",
            Required,
            vec![
                step()
                    .rh("Date", V::At(-10))
                    .rh("Expires", V::At(10))
                    .rh("Age", t("25"))
                    .setup(),
                step().not_cached(),
            ],
        ),
        case(
            "freshness-expires-age-fast-date",
            Required,
            vec![
                step()
                    .rh("Date", V::At(10))
                    .rh("Expires", V::At(20))
                    .rh("Age", t("15"))
                    .setup(),
                step().not_cached(),
            ],
        ),
        // expires-parse
        exp(
            "freshness-expires-32bit",
            Optimal,
            "Tue, 19 Jan 2038 14:14:08 GMT",
            C,
        ),
        exp(
            "freshness-expires-far-future",
            Optimal,
            "Sun, 21 Nov 2286 04:46:39 GMT",
            C,
        ),
        exp(
            "freshness-expires-rfc850",
            Optimal,
            "Thursday, 18-Aug-50 02:01:18 GMT",
            C,
        ),
        exp(
            "freshness-expires-ansi-c",
            Optimal,
            "Thu Aug  8 02:01:18 2050",
            C,
        ),
        exp(
            "freshness-expires-wrong-case-weekday",
            Optimal,
            "THU, 18 Aug 2050 02:01:18 GMT",
            C,
        ),
        exp(
            "freshness-expires-wrong-case-month",
            Optimal,
            "Thu, 18 AUG 2050 02:01:18 GMT",
            C,
        ),
        exp(
            "freshness-expires-wrong-case-tz",
            Optimal,
            "Thu, 18 Aug 2050 02:01:18 gMT",
            C,
        ),
        exp(
            "freshness-expires-invalid-utc",
            Required,
            "Thu, 18 Aug 2050 02:01:18 UTC",
            N,
        ),
        exp(
            "freshness-expires-invalid-aest",
            Required,
            "Thu, 18 Aug 2050 02:01:18 AEST",
            N,
        ),
        exp(
            "freshness-expires-invalid-2-digit-year",
            Required,
            "Thu, 18 Aug 50 02:01:18 GMT",
            N,
        ),
        exp(
            "freshness-expires-invalid-no-comma",
            Required,
            "Thu 18 Aug 2050 02:01:18 GMT",
            N,
        ),
        exp(
            "freshness-expires-invalid-multiple-spaces",
            Required,
            "Thu, 18  Aug  2050 02:01:18 GMT",
            N,
        ),
        exp(
            "freshness-expires-invalid-date-dashes",
            Required,
            "Thu, 18-Aug-2050 02:01:18 GMT",
            N,
        ),
        exp(
            "freshness-expires-invalid-time-periods",
            Required,
            "Thu, 18 Aug 2050 02.01.18 GMT",
            N,
        ),
        exp(
            "freshness-expires-invalid-1-digit-hour",
            Required,
            "Thu, 18 Aug 2050 2:01:18 GMT",
            N,
        ),
        case(
            "freshness-expires-invalid-multiple-lines",
            Required,
            vec![
                step()
                    .rh_raw("Expires", "Thu, 18 Aug 2050 2:01:18 GMT")
                    .rh_raw("Expires", "Thu, 18 Aug 2050 2:01:19 GMT")
                    .rh("Date", V::At(0))
                    .setup(),
                step().not_cached(),
            ],
        ),
    ];
    survey(&h, cases, KNOWN_AGE_EXPIRES).await;
}

const KNOWN_AGE_EXPIRES: &[(&str, &str)] = &[];
