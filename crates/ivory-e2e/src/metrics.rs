//! Reading the API server's Prometheus metrics, e.g. to see that a webhook was called and failed
//! open (`apiserver_admission_webhook_fail_open_count`).

use kube::Client;

use crate::Result;

/// The sum of metric `name`'s samples whose labels include every `(label, value)` of `labels`
/// (0 when there is none), read from the API server's `/metrics`.
pub async fn metric_value(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|err| crate::Error::Request(err.to_string()))?;
    let text = client.request_text(request).await?;
    Ok(sum_samples(&text, name, labels))
}

/// Sums the samples of `name` in Prometheus text exposition `text` that carry all `labels`.
pub(crate) fn sum_samples(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (label_set, value) = match rest.strip_prefix('{') {
                Some(rest) => rest.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            let all_match = labels.iter().all(|(key, val)| {
                label_set
                    .split(',')
                    .any(|pair| pair == format!("{key}=\"{val}\""))
            });
            // A sample line may end with a timestamp after the value.
            let value = value.split_whitespace().next()?;
            all_match.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_admission_webhook_fail_open_count [ALPHA] Admission webhook fail open count.
# TYPE apiserver_admission_webhook_fail_open_count counter
apiserver_admission_webhook_fail_open_count{name="a.ivory.test",type="validating"} 2
apiserver_admission_webhook_fail_open_count{name="b.ivory.test",type="validating"} 5
apiserver_admission_webhook_fail_open_count{name="a.ivory.test",type="admit"} 1
apiserver_admission_webhook_fail_open_count_extra{name="a.ivory.test",type="validating"} 100
plain_metric 7 1700000000
"#;

    #[test]
    fn sums_samples_with_matching_labels() {
        let name = "apiserver_admission_webhook_fail_open_count";
        assert_eq!(
            sum_samples(
                TEXT,
                name,
                &[("name", "a.ivory.test"), ("type", "validating")]
            ),
            2.0
        );
        assert_eq!(sum_samples(TEXT, name, &[("name", "a.ivory.test")]), 3.0);
        assert_eq!(sum_samples(TEXT, name, &[]), 8.0);
        assert_eq!(sum_samples(TEXT, name, &[("name", "c.ivory.test")]), 0.0);
    }

    #[test]
    fn reads_unlabelled_samples_with_timestamps() {
        assert_eq!(sum_samples(TEXT, "plain_metric", &[]), 7.0);
        assert_eq!(sum_samples(TEXT, "plain", &[]), 0.0);
    }
}
