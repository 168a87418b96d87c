//! Sentry's answers to a sender: rate limits of one data category, and
//! client reports of what was lost.

use std::time::{Duration, Instant, SystemTime};

/// How long a `429` without any rate-limit header stops the category.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Why an item was not delivered, as client reports name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    QueueOverflow,
    NetworkError,
    SendError,
    RatelimitBackoff,
}

impl Loss {
    pub(crate) const ALL: [Loss; 4] = [
        Loss::QueueOverflow,
        Loss::NetworkError,
        Loss::SendError,
        Loss::RatelimitBackoff,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Loss::QueueOverflow => "queue_overflow",
            Loss::NetworkError => "network_error",
            Loss::SendError => "send_error",
            Loss::RatelimitBackoff => "ratelimit_backoff",
        }
    }
}

/// Appends a `client_report` item for the losses of `category` in
/// `counts` (indexed like [`Loss::ALL`]); nothing when there are none.
pub(crate) fn append_client_report(
    envelope: &mut Vec<u8>,
    category: &str,
    counts: &[u64; 4],
    now: SystemTime,
) {
    let discarded: Vec<serde_json::Value> = Loss::ALL
        .iter()
        .zip(counts)
        .filter(|(_, n)| **n > 0)
        .map(|(loss, n)| {
            serde_json::json!({ "reason": loss.name(), "category": category, "quantity": n })
        })
        .collect();
    if discarded.is_empty() {
        return;
    }
    let timestamp = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let payload = serde_json::json!({ "timestamp": timestamp, "discarded_events": discarded });
    let Ok(payload) = serde_json::to_vec(&payload) else {
        return;
    };
    crate::encode::envelope::append_item(envelope, r#""type":"client_report""#, &payload);
}

/// Until when Sentry asked for no items of one data category.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateLimits {
    category: &'static str,
    until: Option<Instant>,
}

impl RateLimits {
    pub(crate) fn new(category: &'static str) -> Self {
        Self {
            category,
            until: None,
        }
    }

    /// The time left while the category is rate limited.
    pub(crate) fn limited(&self, now: Instant) -> Option<Duration> {
        self.until
            .and_then(|u| u.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }

    fn extend(&mut self, until: Instant) {
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }

    /// Learns from one response, as Sentry's SDK guidelines say: an
    /// `X-Sentry-Rate-Limits` header is authoritative; otherwise
    /// `Retry-After` applies to everything, and a bare `429` means 60 s.
    pub(crate) fn update(
        &mut self,
        status: u16,
        rate_limits: Option<&str>,
        retry_after: Option<&str>,
        now: Instant,
    ) {
        if let Some(header) = rate_limits {
            // <limit> = <seconds>:<category>(;<category>)*:<scope>[:<reason>...],
            // limits separated by commas; no category means all of them.
            for limit in header.split(',') {
                let mut fields = limit.trim().split(':');
                let Some(Ok(secs)) = fields.next().map(|s| s.trim().parse::<f64>()) else {
                    continue;
                };
                let Some(categories) = fields.next() else {
                    continue;
                };
                let applies = categories.trim().is_empty()
                    || categories.split(';').any(|c| c.trim() == self.category);
                if applies {
                    self.extend(now + seconds(secs));
                }
            }
            return;
        }
        if let Some(value) = retry_after {
            let value = value.trim();
            let wait = match value.parse::<f64>() {
                Ok(secs) => seconds(secs),
                Err(_) => httpdate::parse_http_date(value)
                    .map(|at| {
                        at.duration_since(SystemTime::now())
                            .unwrap_or(Duration::ZERO)
                    })
                    .unwrap_or(DEFAULT_RETRY_AFTER),
            };
            self.extend(now + wait);
        } else if status == 429 {
            self.extend(now + DEFAULT_RETRY_AFTER);
        }
    }
}

/// Whole seconds, rounded up; nonsense (negative, NaN) is zero and absurd
/// values are capped at a day.
fn seconds(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::from_secs(secs.ceil().min(86_400.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited_for(status: u16, rl: Option<&str>, ra: Option<&str>) -> Option<u64> {
        let now = Instant::now();
        let mut l = RateLimits::new("profile_chunk");
        l.update(status, rl, ra, now);
        l.limited(now).map(|d| d.as_secs())
    }

    #[test]
    fn rate_limit_header() {
        let h = "60:profile_chunk:organization";
        assert_eq!(limited_for(200, Some(h), None), Some(60));
        assert_eq!(limited_for(429, Some(h), None), Some(60));
        // Several categories, a reason, and the longest limit wins.
        let h = "10:transaction;profile_chunk:key:quota_exceeded, 30:profile_chunk:project";
        assert_eq!(limited_for(200, Some(h), None), Some(30));
        // No category: everything is limited.
        assert_eq!(limited_for(429, Some("2.5::organization"), None), Some(3));
        // Other categories, including the UI profile category, do not stop
        // backend chunks; nor does a malformed limit.
        let h = "60:transaction;profile_chunk_ui;error:organization, x:profile_chunk:org";
        assert_eq!(limited_for(200, Some(h), None), None);
        // The header wins over Retry-After and the status.
        assert_eq!(
            limited_for(429, Some("60:error:organization"), Some("10")),
            None
        );
    }

    /// Each sender learns its own category's limits (and limits on all).
    #[test]
    fn the_transaction_category() {
        let now = Instant::now();
        let mut l = RateLimits::new("transaction");
        l.update(200, Some("60:profile_chunk:org, 5:error:org"), None, now);
        assert_eq!(l.limited(now), None);
        l.update(429, Some("30:transaction;span:org:quota"), None, now);
        assert_eq!(l.limited(now).map(|d| d.as_secs()), Some(30));
    }

    #[test]
    fn retry_after_and_bare_429() {
        assert_eq!(limited_for(429, None, Some("7")), Some(7));
        assert_eq!(limited_for(503, None, Some("7")), Some(7));
        assert_eq!(limited_for(429, None, None), Some(60));
        assert_eq!(limited_for(200, None, None), None);
        assert_eq!(limited_for(503, None, None), None);
        // An HTTP date in the past means no wait; garbage means the default.
        let past = "Wed, 21 Oct 2015 07:28:00 GMT";
        assert_eq!(limited_for(429, None, Some(past)), None);
        assert_eq!(limited_for(429, None, Some("soon")), Some(60));
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let secs = limited_for(429, None, Some(&later)).unwrap();
        assert!((118..=120).contains(&secs), "{secs}");
    }

    #[test]
    fn client_report_item() {
        let mut env = b"{}\n{\"type\":\"profile_chunk\",\"length\":2}\n{}\n".to_vec();
        append_client_report(&mut env, "profile_chunk", &[0; 4], SystemTime::now());
        assert_eq!(env.iter().filter(|b| **b == b'\n').count(), 3, "no losses");
        append_client_report(
            &mut env,
            "profile_chunk",
            &[2, 0, 5, 0],
            SystemTime::UNIX_EPOCH,
        );
        let text = String::from_utf8(env).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5);
        let header: serde_json::Value = serde_json::from_str(lines[3]).unwrap();
        assert_eq!(header["type"], "client_report");
        assert_eq!(header["length"].as_u64(), Some(lines[4].len() as u64));
        let report: serde_json::Value = serde_json::from_str(lines[4]).unwrap();
        assert_eq!(
            report["discarded_events"],
            serde_json::json!([
                {"reason": "queue_overflow", "category": "profile_chunk", "quantity": 2},
                {"reason": "send_error", "category": "profile_chunk", "quantity": 5},
            ])
        );
    }
}
