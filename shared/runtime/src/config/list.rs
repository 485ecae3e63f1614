//! Lists that a file writes as a list and the environment as one comma-separated string
//! ([`list_or_comma_separated_of`]).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// An item of a list the environment writes as one string of comma-separated pieces.
pub(crate) trait ListItem: Sized {
    /// What the list is, for the error of a value that is neither a list nor a string.
    const EXPECTING: &'static str;

    /// The item one (untrimmed) comma-separated piece writes; `None` drops the piece (a blank
    /// one, where blanks are dropped). The error is the message of the key's error.
    fn from_piece(piece: &str) -> Result<Option<Self>, String>;

    /// An item read from a list, kept as it is or (`None`) dropped; by default kept.
    fn keep(self) -> Option<Self> {
        Some(self)
    }
}

/// Blank entries are dropped, the others trimmed (in a list as in a comma-separated string).
impl ListItem for String {
    const EXPECTING: &'static str = "a list of strings or one comma-separated string";

    fn from_piece(piece: &str) -> Result<Option<Self>, String> {
        Ok(piece.to_owned().keep())
    }

    fn keep(self) -> Option<Self> {
        let trimmed = self.trim();
        (!trimmed.is_empty()).then(|| trimmed.to_owned())
    }
}

/// Accepts a list of `T`, or one string of comma-separated pieces (how lists arrive from the
/// environment), each read by [`ListItem::from_piece`].
pub(crate) fn list_or_comma_separated_of<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: ListItem + Deserialize<'de>,
{
    struct ListVisitor<T>(PhantomData<T>);

    impl<'de, T: ListItem + Deserialize<'de>> Visitor<'de> for ListVisitor<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(T::EXPECTING)
        }

        fn visit_str<E: de::Error>(self, pieces: &str) -> Result<Self::Value, E> {
            pieces.split(',').filter_map(|piece| T::from_piece(piece).map_err(E::custom).transpose()).collect()
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element::<T>()? {
                items.extend(item.keep());
            }
            Ok(items)
        }
    }

    deserializer.deserialize_any(ListVisitor(PhantomData))
}

/// [`list_or_comma_separated_of`] for a list that may be left unset (`None` when the key is
/// absent, with `#[serde(default)]`).
pub(crate) fn optional_list_or_comma_separated_of<'de, D, T>(deserializer: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: ListItem + Deserialize<'de>,
{
    list_or_comma_separated_of(deserializer).map(Some)
}
