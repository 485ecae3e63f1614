//! [`until_short`]: the loop of every bounded clean-up (expiry, trimming), which deletes at
//! most a batch per store call so no call holds the store for long.

use std::future::Future;

/// Calls `batch(max)` until a call handles fewer than `max` items; how many in all. The first
/// error ends it (what is left waits for the next pass).
pub async fn until_short<E, F, Fut>(max: usize, mut batch: F) -> Result<usize, E>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<usize, E>>,
{
    let mut total = 0;
    loop {
        let n = batch(max).await?;
        total += n;
        if n < max {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_again_while_batches_are_full() {
        let mut left = 25usize;
        let mut calls = 0;
        let total = until_short(10, |max| {
            calls += 1;
            let n = left.min(max);
            left -= n;
            async move { Ok::<_, ()>(n) }
        })
        .await;
        assert_eq!((total, calls), (Ok(25), 3));
    }

    #[tokio::test]
    async fn a_full_last_batch_costs_one_empty_call_and_an_error_ends_it() {
        let mut calls = 0;
        let total = until_short(5, |_| {
            calls += 1;
            async move { Ok::<_, ()>(if calls == 1 { 5 } else { 0 }) }
        })
        .await;
        assert_eq!((total, calls), (Ok(5), 2));
        assert_eq!(until_short(5, |_| async { Err::<usize, _>("store down") }).await, Err("store down"));
    }
}
