//! The `Retry-After` header: a delay in seconds or an HTTP date.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The delay `Retry-After` asks for, measured from `now`; a date in the past is no delay.
/// `None` when the header is absent or malformed.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if value.bytes().all(|b| b.is_ascii_digit()) && !value.is_empty() {
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn seconds_and_dates_are_read() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(retry_after(&headers("120"), now), Some(Duration::from_secs(120)));
        assert_eq!(retry_after(&headers(" 0 "), now), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers("Sun, 06 Nov 1994 08:50:07 GMT"), now), Some(Duration::from_secs(30)));
        assert_eq!(retry_after(&headers("Sun, 06 Nov 1994 08:00:00 GMT"), now), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers("99999999999999999999999"), now), Some(Duration::from_secs(u64::MAX)));
    }

    #[test]
    fn absent_or_malformed_is_none() {
        let now = SystemTime::UNIX_EPOCH;
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
        for bad in ["-5", "1.5", "soon", "Sun, 06 Nov 1994"] {
            assert_eq!(retry_after(&headers(bad), now), None, "{bad}");
        }
    }
}
