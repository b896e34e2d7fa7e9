//! JSON helpers shared by the formats: reading one JSON value from the front
//! of a text, and turning a `{"name", "arguments"}` object into a call. Must
//! not: repair broken JSON (a failure is reported, never patched).

use serde_json::{Deserializer, Map, Value as Json};

use super::RawCall;

/// Reads one JSON value at the start of `s` (leading whitespace allowed).
/// Returns the value and the byte offset just past it.
pub fn value_prefix(s: &str) -> Result<(Json, usize), String> {
    let mut it = Deserializer::from_str(s).into_iter::<Json>();
    match it.next() {
        Some(Ok(v)) => Ok((v, it.byte_offset())),
        Some(Err(e)) => Err(format!("invalid JSON: {e}")),
        None => Err("expected JSON, found nothing".into()),
    }
}

/// `s` must be exactly one JSON value, whitespace around it allowed.
pub fn value_exact(s: &str) -> Result<Json, String> {
    let (v, end) = value_prefix(s)?;
    let rest = s.get(end..).unwrap_or("");
    if rest.trim().is_empty() {
        Ok(v)
    } else {
        Err(format!(
            "unexpected text after JSON: {:?}",
            short(rest.trim_start())
        ))
    }
}

/// At most 40 characters of `s`, for messages.
pub fn short(s: &str) -> String {
    s.chars().take(40).collect()
}

/// The arguments as compact JSON object text. Accepted: an object; a
/// string holding a JSON object; nothing / `null` (a call without
/// arguments, `{}`).
pub fn arguments_text(v: Option<&Json>) -> Result<String, String> {
    match v {
        None | Some(Json::Null) => Ok("{}".into()),
        Some(obj @ Json::Object(_)) => Ok(obj.to_string()),
        Some(Json::String(s)) => match value_exact(s) {
            Ok(obj @ Json::Object(_)) => Ok(obj.to_string()),
            _ => Err("arguments is a string that is not a JSON object".into()),
        },
        Some(_) => Err("arguments is not a JSON object".into()),
    }
}

/// A call from `{"name": ..., <one of arg_keys>: {...}}`; other keys are
/// ignored.
pub fn call_from_object(v: &Json, arg_keys: &[&str]) -> Result<RawCall, String> {
    let obj: &Map<String, Json> = v
        .as_object()
        .ok_or_else(|| "tool call is not a JSON object".to_string())?;
    let name = match obj.get("name") {
        Some(Json::String(n)) if !n.trim().is_empty() => n.clone(),
        _ => return Err("tool call has no \"name\" string".into()),
    };
    let present: Vec<&&str> = arg_keys.iter().filter(|k| obj.contains_key(**k)).collect();
    if present.len() > 1 {
        return Err(format!(
            "tool call has both {:?} and {:?}",
            present[0], present[1]
        ));
    }
    let args = present.first().and_then(|k| obj.get(**k));
    Ok(RawCall {
        name,
        arguments: arguments_text(args)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_in_model_key_order() {
        let v = value_exact(r#" { "name" : "f", "arguments" : { "z" : 1, "a" : [1, 2] } } "#)
            .expect("valid JSON");
        let c = call_from_object(&v, &["arguments"]).expect("a call");
        assert_eq!(c.name, "f");
        assert_eq!(c.arguments, r#"{"z":1,"a":[1,2]}"#);
    }

    #[test]
    fn prefix_offsets_and_errors() {
        let (v, end) = value_prefix(r#"{"a":1} ; {"b":2}"#).expect("valid");
        assert_eq!(v["a"], 1);
        assert_eq!(end, 7);
        assert!(value_exact(r#"{"a":1} x"#).is_err());
        assert!(value_prefix(r#"{"a":"#).is_err());
        assert!(value_prefix("   ").is_err());
    }

    #[test]
    fn argument_shapes() {
        assert_eq!(arguments_text(None).as_deref(), Ok("{}"));
        let s = Json::String(r#"{"x": 1}"#.into());
        assert_eq!(arguments_text(Some(&s)).as_deref(), Ok(r#"{"x":1}"#));
        assert!(arguments_text(Some(&Json::from(3))).is_err());
        assert!(arguments_text(Some(&Json::String("nope".into()))).is_err());
        let both = value_exact(r#"{"name":"f","arguments":{},"parameters":{}}"#).expect("valid");
        assert!(call_from_object(&both, &["arguments", "parameters"]).is_err());
        let noname = value_exact(r#"{"arguments":{}}"#).expect("valid");
        assert!(call_from_object(&noname, &["arguments"]).is_err());
    }
}
