//! Deserialisers that enforce limits while reading, so an oversized list or file is refused
//! before it is allocated.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};

/// Deserialises a sequence, failing as soon as it holds more than `MAX` elements.
pub(crate) fn bounded_vec<'de, D, T, const MAX: usize>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<T, const MAX: usize>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>, const MAX: usize> Visitor<'de> for Bounded<T, MAX> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a list of at most {MAX} entries")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX));
            while let Some(item) = seq.next_element()? {
                if out.len() == MAX {
                    return Err(de::Error::custom(format!(
                        "more than {MAX} entries (the limit)"
                    )));
                }
                out.push(item);
            }
            Ok(out)
        }
    }

    d.deserialize_seq(Bounded::<T, MAX>(PhantomData))
}
