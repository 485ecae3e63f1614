//! Results collected by index: a batch call answers its items out of order (some at once, some
//! after a store round trip, some one by one), and its caller wants them back in order.

/// One slot per item of a batch, filled in any order and read back in order once each is.
pub(crate) struct Slots<T>(Vec<Option<T>>);

impl<T> Slots<T> {
    /// `len` empty slots.
    pub(crate) fn new(len: usize) -> Self {
        Self(std::iter::repeat_with(|| None).take(len).collect())
    }

    /// Puts the result of item `index`.
    pub(crate) fn fill(&mut self, index: usize, value: T) {
        self.0[index] = Some(value);
    }

    /// The results in order.
    ///
    /// # Panics
    ///
    /// When a slot was never filled: the batch lost track of an item, a bug to surface rather
    /// than answer the item with nothing.
    pub(crate) fn into_vec(self) -> Vec<T> {
        self.0
            .into_iter()
            .enumerate()
            .map(|(i, value)| value.unwrap_or_else(|| panic!("item {i} of the batch was given no result")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Slots;

    #[test]
    fn slots_filled_out_of_order_read_back_in_order() {
        let mut slots = Slots::new(3);
        slots.fill(2, "c");
        slots.fill(0, "a");
        slots.fill(1, "b");
        assert_eq!(slots.into_vec(), ["a", "b", "c"]);
    }

    #[test]
    #[should_panic(expected = "item 1 of the batch was given no result")]
    fn a_slot_left_empty_is_a_bug_that_surfaces() {
        let mut slots = Slots::new(2);
        slots.fill(0, ());
        slots.into_vec();
    }
}
