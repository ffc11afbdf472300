//! `--simulate` specs: a comma list of `PRODUCT:COUNT`, e.g. `h200:8` or `a100-40gb:2,h100-80gb:2`.

use crate::products::{self, Product};
use std::fmt;
use std::str::FromStr;

/// A parsed simulate spec: products in GPU index order.
#[derive(Debug, Clone)]
pub struct SimSpec {
    pub groups: Vec<(&'static Product, u32)>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("empty simulate spec: expected PRODUCT:COUNT[,PRODUCT:COUNT...], e.g. h200:8")]
    Empty,
    #[error("simulate spec item {item:?}: expected PRODUCT:COUNT, e.g. h200:8")]
    Shape { item: String },
    #[error("simulate spec item {item:?}: unknown product {product:?} (known: {known})")]
    UnknownProduct { item: String, product: String, known: String },
    #[error("simulate spec item {item:?}: count must be a whole number from 1 to 64")]
    Count { item: String },
}

impl FromStr for SimSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut groups = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, count) = item.split_once(':').ok_or_else(|| SpecError::Shape { item: item.to_string() })?;
            let product = products::find(key.trim()).ok_or_else(|| SpecError::UnknownProduct {
                item: item.to_string(),
                product: key.to_string(),
                known: products::PRODUCTS.iter().map(|p| p.key).collect::<Vec<_>>().join(" "),
            })?;
            let count: u32 = count
                .trim()
                .parse()
                .ok()
                .filter(|c| (1..=64).contains(c))
                .ok_or_else(|| SpecError::Count { item: item.to_string() })?;
            groups.push((product, count));
        }
        if groups.is_empty() {
            return Err(SpecError::Empty);
        }
        Ok(SimSpec { groups })
    }
}

impl fmt::Display for SimSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<String> = self.groups.iter().map(|(p, n)| format!("{}:{n}", p.key)).collect();
        f.write_str(&items.join(","))
    }
}

impl SimSpec {
    /// Products in GPU index order, one entry per GPU.
    pub fn gpus(&self) -> impl Iterator<Item = &'static Product> + '_ {
        self.groups.iter().flat_map(|(p, n)| std::iter::repeat_n(*p, *n as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let ok = [("h200:8", 8), ("a100-40gb:2,h100-80gb:2", 4), (" a30:1 , b200:3 ", 4)];
        for (input, gpus) in ok {
            let spec: SimSpec = input.parse().unwrap();
            assert_eq!(spec.gpus().count(), gpus, "{input}");
        }
        let bad = [
            ("", "empty"),
            ("h200", "expected PRODUCT:COUNT"),
            ("h300:1", "unknown product \"h300\""),
            ("h200:0", "count must be"),
            ("h200:x", "count must be"),
        ];
        for (input, want) in bad {
            let err = input.parse::<SimSpec>().unwrap_err().to_string();
            assert!(err.contains(want), "{input}: {err}");
        }
    }
}
