//! Counts in the lines people read: "1 update", "2 updates".

/// `n` and `noun`, the noun in the plural unless `n` is 1 ("batch" →
/// "batches").
pub fn counted(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    match (n, noun.ends_with("ch")) {
        (1, _) => format!("1 {noun}"),
        (_, true) => format!("{n} {noun}es"),
        (_, false) => format!("{n} {noun}s"),
    }
}

/// The plural ending of a regular noun counted `n` times.
pub fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::counted;

    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(counted(1u64, "update"), "1 update");
        assert_eq!(counted(0u64, "update"), "0 updates");
        assert_eq!(counted(2u64, "dead letter"), "2 dead letters");
        assert_eq!(counted(1u64, "batch"), "1 batch");
        assert_eq!(counted(3u64, "batch"), "3 batches");
    }
}
