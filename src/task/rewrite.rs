//! A task's value written back with updates, its fields' values kept as they were written:
//! only the top-level names are read, each value is validated and copied as bytes. A 20 KB
//! `taskPara` is copied once, not unescaped into a string and escaped back out, which was
//! most of what a claim of a large task cost the leader.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// A JSON object's top-level fields in order, each value as its bytes. A name given twice
/// keeps its first place and its last value, as a parsed `serde_json::Map` does.
pub(super) struct RawFields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> RawFields<'a> {
    pub(super) fn parse(value: &'a [u8]) -> serde_json::Result<RawFields<'a>> {
        serde_json::from_slice(value)
    }

    fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|(n, _)| n == name)
    }
}

impl<'de> Deserialize<'de> for RawFields<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(FieldsVisitor)
    }
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = RawFields<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<RawFields<'de>, M::Error> {
        let mut fields: Vec<(Cow<'de, str>, &'de RawValue)> = Vec::new();
        // Where each name is, to find one given twice without a scan per field.
        let mut places: HashMap<Cow<'de, str>, usize, foldhash::fast::RandomState> =
            HashMap::default();
        while let Some(Name(name)) = map.next_key()? {
            let value: &'de RawValue = map.next_value()?;
            match places.get(&name) {
                Some(&at) => fields[at].1 = value,
                None => {
                    places.insert(name.clone(), fields.len());
                    fields.push((name, value));
                }
            }
        }
        Ok(RawFields(fields))
    }
}

/// A field's name, borrowed from the value unless it holds escapes.
pub(super) struct Name<'a>(pub(super) Cow<'a, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(NameVisitor)
    }
}

struct NameVisitor;

impl<'de> Visitor<'de> for NameVisitor {
    type Value = Name<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_borrowed_str<E>(self, name: &'de str) -> Result<Name<'de>, E> {
        Ok(Name(Cow::Borrowed(name)))
    }

    fn visit_str<E>(self, name: &str) -> Result<Name<'de>, E> {
        Ok(Name(Cow::Owned(name.to_string())))
    }

    fn visit_string<E>(self, name: String) -> Result<Name<'de>, E> {
        Ok(Name(Cow::Owned(name)))
    }
}

/// A task's fields with updates applied, as they serialize: an updated field keeps its
/// place, a new one comes last, a `Null` update removes the field; the last update of a
/// name wins.
pub(super) struct Rewritten<'a> {
    pub(super) fields: &'a RawFields<'a>,
    pub(super) updates: &'a [(&'a str, Value)],
}

impl Serialize for Rewritten<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let update = |name: &str| self.updates.iter().rev().find(|(n, _)| *n == name);
        let mut map = serializer.serialize_map(None)?;
        for (name, value) in &self.fields.0 {
            match update(name) {
                Some((_, new)) if new.is_null() => {}
                Some((_, new)) => map.serialize_entry(name, new)?,
                None => map.serialize_entry(name, value)?,
            }
        }
        for (i, (name, new)) in self.updates.iter().enumerate() {
            let last = self.updates.iter().rposition(|(n, _)| n == name) == Some(i);
            if last && !new.is_null() && !self.fields.contains(name) {
                map.serialize_entry(name, new)?;
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::{RawFields, Rewritten};

    fn rewrite(value: &str, updates: &[(&str, Value)]) -> String {
        let fields = RawFields::parse(value.as_bytes()).unwrap();
        serde_json::to_string(&Rewritten {
            fields: &fields,
            updates,
        })
        .unwrap()
    }

    /// Values leaderq does not change are copied as written (spacing, escapes, number
    /// forms); a name given twice keeps its first place and its last value, as a parsed
    /// map would; names with escapes are written back escaped as JSON needs.
    #[test]
    fn unchanged_values_are_copied_as_written() {
        let value = r#" {"a" : {"x": [1, 2.50, 1e3]}, "s":"\u00e9\"\\", "a":7, "n\"m":null} "#;
        assert_eq!(
            rewrite(value, &[]),
            r#"{"a":7,"s":"\u00e9\"\\","n\"m":null}"#
        );
        assert_eq!(
            rewrite(value, &[("s", Value::Null), ("taskTaken", json!(true))]),
            r#"{"a":7,"n\"m":null,"taskTaken":true}"#
        );
        let big = format!(
            r#"{{"taskPara":{{"blob":"{}"}},"taskTaken":false}}"#,
            "x".repeat(20_000)
        );
        let out = rewrite(&big, &[("taskTaken", json!(true))]);
        assert_eq!(
            out,
            big.replace("\"taskTaken\":false", "\"taskTaken\":true")
        );
    }

    /// What is not an object is refused, as the parse of a task's value refuses it.
    #[test]
    fn only_an_object_has_fields() {
        for value in ["[1]", "\"s\"", "{\"a\":}", "{\"a\":1"] {
            assert!(RawFields::parse(value.as_bytes()).is_err(), "{value}");
        }
    }
}
