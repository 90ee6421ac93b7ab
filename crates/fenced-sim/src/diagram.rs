//! Text sequence diagram (being built).

use crate::{Record, Summary};

pub fn render(_records: &[Record], _s: &Summary) -> String {
    String::new()
}
