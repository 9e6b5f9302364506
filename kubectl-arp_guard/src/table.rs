//! A server-side Table, as kubectl reads lists (`Accept: application/json;
//! as=Table`, `includeObject=None`): the columns the API server prints for
//! a kind and a row of cells per object, not the objects. What the views
//! from the API need of 5,000 Pods or Nodes is then a few hundred kB.

/// What kubectl asks for to get a Table.
pub const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json";

/// A server-side Table: its columns, and a row of cells per object.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Table {
    #[serde(default)]
    column_definitions: Vec<Column>,
    #[serde(default)]
    pub rows: Vec<Row>,
}

#[derive(Debug, serde::Deserialize)]
struct Column {
    name: String,
}

#[derive(Debug, serde::Deserialize)]
pub struct Row {
    #[serde(default)]
    cells: Vec<serde_json::Value>,
}

impl Table {
    /// Row `r`'s cell of column `name`, as text.
    pub fn cell(&self, r: &Row, name: &str) -> Option<String> {
        let i = self
            .column_definitions
            .iter()
            .position(|c| c.name == name)?;
        match r.cells.get(i)? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Null => None,
            v => Some(v.to_string()),
        }
    }
}

/// `s` for a URL's query.
pub fn urlencoded(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
