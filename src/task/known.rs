//! The fields of a task's value that reading it looks at, parsed; every other field
//! (`taskPara` above all) is read through as a parse into a `serde_json::Value` would read it
//! (so a value that one refuses, a number out of range, is refused here too) but never built
//! into a tree. A name given twice keeps its last value, as a parsed `serde_json::Map` does.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::rewrite::Name;

/// The top-level fields [`super::Task`] reads, each `None` when absent (`Some(Null)` when
/// written as null).
#[derive(Debug, Default)]
pub(super) struct Known {
    pub task_type: Option<Value>,
    pub time: Option<Value>,
    pub taken: Option<Value>,
    pub group: Option<Value>,
    pub run_at: Option<Value>,
    pub id: Option<Value>,
    pub attempts: Option<Value>,
    pub not_before: Option<Value>,
    pub taken_by: Option<Value>,
    pub last_error: Option<Value>,
    pub max_attempts: Option<Value>,
    pub priority: Option<Value>,
}

/// A value read for its known fields: an object, or the kind of JSON value it is instead.
#[derive(Debug)]
pub(super) enum Read {
    Object(Box<Known>),
    Not(&'static str),
}

impl Read {
    pub(super) fn parse(value: &[u8]) -> serde_json::Result<Read> {
        // Past JSON's whitespace (space, tab, line feed, carriage return), an object opens
        // with `{`; anything else is read through for its kind (or refused).
        match value
            .iter()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            Some(b'{') => serde_json::from_slice(value).map(|known| Read::Object(Box::new(known))),
            _ => serde_json::from_slice(value).map(|Kind(kind)| Read::Not(kind)),
        }
    }
}

impl<'de> Deserialize<'de> for Known {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(KnownVisitor)
    }
}

struct KnownVisitor;

impl<'de> Visitor<'de> for KnownVisitor {
    type Value = Known;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Known, M::Error> {
        let mut known = Known::default();
        while let Some(Name(name)) = map.next_key()? {
            let slot = match &*name {
                "taskType" => &mut known.task_type,
                "taskTime" => &mut known.time,
                "taskTaken" => &mut known.taken,
                "taskGroup" => &mut known.group,
                "runAt" => &mut known.run_at,
                "taskId" => &mut known.id,
                "attempts" => &mut known.attempts,
                "notBefore" => &mut known.not_before,
                "takenBy" => &mut known.taken_by,
                "lastError" => &mut known.last_error,
                "maxAttempts" => &mut known.max_attempts,
                "taskPriority" => &mut known.priority,
                _ => {
                    map.next_value::<Kind>()?;
                    continue;
                }
            };
            *slot = Some(map.next_value()?);
        }
        Ok(known)
    }
}

/// A JSON value read through and dropped, answering only its kind: every number converted
/// and every string unescaped as a `serde_json::Value` would be (`IgnoredAny` checks less:
/// it takes `1e400`, which a `Value` refuses), nothing kept.
struct Kind(&'static str);

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(KindVisitor)
    }
}

struct KindVisitor;

impl<'de> Visitor<'de> for KindVisitor {
    type Value = Kind;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Kind, M::Error> {
        while map.next_entry::<Kind, Kind>()?.is_some() {}
        Ok(Kind("object"))
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Kind, S::Error> {
        while seq.next_element::<Kind>()?.is_some() {}
        Ok(Kind("array"))
    }

    fn visit_unit<E>(self) -> Result<Kind, E> {
        Ok(Kind("null"))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Kind, E> {
        Ok(Kind("boolean"))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Kind, E> {
        Ok(Kind("number"))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Kind, E> {
        Ok(Kind("number"))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Kind, E> {
        Ok(Kind("number"))
    }

    fn visit_str<E>(self, _: &str) -> Result<Kind, E> {
        Ok(Kind("string"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(json: &str) -> Known {
        match Read::parse(json.as_bytes()).unwrap() {
            Read::Object(known) => *known,
            Read::Not(kind) => panic!("{json} read as {kind}"),
        }
    }

    /// The fields read are the known ones, the last of a name given twice, null kept as
    /// null; every other field is checked as JSON but not kept, however deep or large.
    #[test]
    fn known_fields_are_read_and_the_rest_skipped() {
        let read = known(
            r#"{"taskType":"a","taskPara":{"deep":[[[{"x":1e300}]]],"s":"\u00e9"},
               "taskType":"b","taskTime":null,"takenBy":{"node":"n"},"t\u0061skId":7}"#,
        );
        assert_eq!(read.task_type, Some(Value::from("b")));
        assert_eq!(read.time, Some(Value::Null));
        assert_eq!(read.taken, None);
        assert_eq!(
            read.id,
            Some(Value::from(7)),
            "a name written with an escape"
        );
        assert_eq!(read.taken_by, Some(serde_json::json!({"node": "n"})));
        let spaced = known(" \t\r\n{\"taskType\":\"a\"} ");
        assert_eq!(spaced.task_type, Some(Value::from("a")));
        let err = |json: &str| Read::parse(json.as_bytes()).is_err();
        assert!(
            err(r#"{"taskType":"a","taskPara":{"x":}}"#),
            "a skipped field must be JSON"
        );
        assert!(err(r#"{"taskType":"a"} trailing"#));
        assert!(err("not json"));
        // Refused as a `Value` refuses it: `Task::fields` parses the value again as one.
        assert!(serde_json::from_str::<Value>(r#"{"x":[1e400]}"#).is_err());
        assert!(err(r#"{"taskType":"a","taskPara":{"x":[1e400]}}"#));
        assert!(
            err(r#"{"taskType":"a","taskPara":"\ud800"}"#),
            "a lone surrogate"
        );
    }

    /// A value that is not an object reads as its kind.
    #[test]
    fn a_value_other_than_an_object_reads_as_its_kind() {
        for (json, kind) in [
            ("[1,[2]]", "array"),
            ("null", "null"),
            ("true", "boolean"),
            ("-3", "number"),
            ("3", "number"),
            ("1.5", "number"),
            (r#""s""#, "string"),
            (r#""\u00e9""#, "string"),
        ] {
            match Read::parse(json.as_bytes()).unwrap() {
                Read::Not(read) => assert_eq!(read, kind, "{json}"),
                Read::Object(_) => panic!("{json} read as an object"),
            }
        }
    }
}
