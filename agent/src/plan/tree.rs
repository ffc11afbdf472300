//! A small span-carrying tree built from `toml_edit`'s document, so that the schema walk in
//! [`super::parse`] can treat `[[gpus]]` tables and inline tables alike and point every problem
//! at a line.

use std::ops::Range;
use toml_edit::{Item, Table, Value};

#[derive(Debug, Clone)]
pub struct Node {
    pub kind: Kind,
    pub span: Range<usize>,
}

#[derive(Debug, Clone)]
pub enum Kind {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Array(Vec<Node>),
    Table(Vec<(String, Node)>),
    Datetime,
}

impl Node {
    /// A word for error messages: "a string", "an integer", ...
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            Kind::Str(_) => "a string",
            Kind::Int(_) => "an integer",
            Kind::Float(_) => "a float",
            Kind::Bool(_) => "a boolean",
            Kind::Array(_) => "an array",
            Kind::Table(_) => "a table",
            Kind::Datetime => "a datetime",
        }
    }
}

/// Converts a parsed document's root table.
pub fn from_table(table: &Table, fallback: Range<usize>) -> Node {
    let span = table.span().unwrap_or(fallback);
    let entries = table
        .iter()
        .filter_map(|(key, item)| {
            let key_span = table.get_key_value(key).and_then(|(k, _)| k.span()).unwrap_or(span.clone());
            from_item(item, key_span).map(|node| (key.to_string(), node))
        })
        .collect();
    Node { kind: Kind::Table(entries), span }
}

fn from_item(item: &Item, fallback: Range<usize>) -> Option<Node> {
    match item {
        Item::None => None,
        Item::Value(value) => Some(from_value(value, fallback)),
        Item::Table(table) => Some(from_table(table, fallback)),
        Item::ArrayOfTables(array) => {
            let span = array.span().unwrap_or(fallback.clone());
            let tables = array.iter().map(|t| from_table(t, fallback.clone())).collect();
            Some(Node { kind: Kind::Array(tables), span })
        }
    }
}

fn from_value(value: &Value, fallback: Range<usize>) -> Node {
    let span = value.span().unwrap_or(fallback.clone());
    let kind = match value {
        Value::String(s) => Kind::Str(s.value().clone()),
        Value::Integer(i) => Kind::Int(*i.value()),
        Value::Float(f) => Kind::Float(*f.value()),
        Value::Boolean(b) => Kind::Bool(*b.value()),
        Value::Datetime(_) => Kind::Datetime,
        Value::Array(array) => Kind::Array(array.iter().map(|v| from_value(v, span.clone())).collect()),
        Value::InlineTable(table) => Kind::Table(
            table
                .iter()
                .map(|(key, v)| {
                    let key_span = table.get_key_value(key).and_then(|(k, _)| k.span()).unwrap_or(span.clone());
                    (key.to_string(), from_value(v, key_span))
                })
                .collect(),
        ),
    };
    Node { kind, span }
}

/// Maps byte offsets to 1-based line and column.
pub struct Lines {
    starts: Vec<usize>,
}

impl Lines {
    pub fn new(text: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Lines { starts }
    }

    pub fn locate(&self, offset: usize) -> (u32, u32) {
        let line = self.starts.partition_point(|&s| s <= offset).max(1);
        let col = offset - self.starts[line - 1] + 1;
        (line as u32, col as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_lines() {
        let lines = Lines::new("a\nbc\n\nd");
        let cases = [(0, (1, 1)), (2, (2, 1)), (3, (2, 2)), (5, (3, 1)), (6, (4, 1))];
        for (offset, want) in cases {
            assert_eq!(lines.locate(offset), want, "offset {offset}");
        }
    }
}
