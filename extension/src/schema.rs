//! Compiling a contract's JSON Schema so that its validation can be interrupted.
//!
//! Validation is pure Rust (the `jsonschema` crate) and never returns to PostgreSQL until it is
//! done. Most schemas validate in microseconds, but applicators nest: a `$ref` inside `anyOf` or
//! `allOf` may evaluate its target twice, and each level of nesting doubles the work, so a 2 kB
//! schema can keep a backend busy for minutes on one result — holding the job's row lock. A
//! cancel or `statement_timeout` must stop it like any other statement.
//!
//! So before compiling, every subschema gets one more keyword, [`INTERRUPT_KEYWORD`], whose
//! check services PostgreSQL's pending interrupts (and always passes). Every re-evaluation goes
//! through a subschema, so the work between two checks is bounded by the size of one subschema,
//! not by the nesting. The keyword is only added where a schema stands: under the applicators
//! of draft 2020-12 (and the older spellings), at local `$ref` targets and at objects that carry
//! `$id`, `$anchor` or `$dynamicAnchor`; never inside `enum`, `const`, `default` or `examples`,
//! which are data, nor to maps such as `properties` themselves, where it would be a property.

use serde_json::Value;

/// The keyword added to every subschema.
pub const INTERRUPT_KEYWORD: &str = "x-pg-intent-interrupt-check";

/// Compiles a schema (draft 2020-12) with interrupt checks in every subschema.
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    let mut checked = schema.clone();
    add_checks(&mut checked);
    jsonschema::draft202012::options()
        .with_keyword(INTERRUPT_KEYWORD, |_, _, _| Ok(Box::new(InterruptCheck)))
        .build(&checked)
        .map_err(|e| e.to_string())
}

/// Compiles a schema as given, without interrupt checks: to tell whether it is valid at all
/// (its error messages then speak of the user's schema, not of the keyword added to it).
pub fn check_valid(schema: &Value) -> Result<(), String> {
    jsonschema::draft202012::new(schema)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

struct InterruptCheck;

impl<'i> jsonschema::Keyword<'i> for InterruptCheck {
    fn validate(&self, _instance: &'i Value) -> Result<(), jsonschema::ValidationError<'i>> {
        pgrx::check_for_interrupts!();
        Ok(())
    }

    fn is_valid(&self, _instance: &'i Value) -> bool {
        pgrx::check_for_interrupts!();
        true
    }
}

/// Keywords whose value is one schema.
const ONE_SCHEMA: &[&str] = &[
    "additionalProperties",
    "additionalItems",
    "unevaluatedItems",
    "unevaluatedProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "contentSchema",
    "items",
];
/// Keywords whose value is an array of schemas (`items` too, in drafts before 2020-12).
const SCHEMA_ARRAYS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems", "items"];
/// Keywords whose value is a map of schemas (`dependencies` maps to schemas or to arrays).
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];
/// Keywords whose value is data, never a schema.
const DATA: &[&str] = &["enum", "const", "default", "examples"];

/// Adds the interrupt check to every subschema of `schema` (see the module comment).
pub fn add_checks(schema: &mut Value) {
    // Local JSON-pointer $ref targets, read before anything is added.
    let mut targets = Vec::new();
    collect_refs(schema, false, &mut targets);
    add_to_schema(schema);
    for pointer in targets {
        if let Some(target) = schema.pointer_mut(&pointer)
            && target.is_object()
            && !inside_data(&pointer)
        {
            add_to_schema(target);
        }
    }
    add_to_identified(schema, false);
}

/// A schema position: marks the object and every schema below it.
fn add_to_schema(schema: &mut Value) {
    let Value::Object(map) = schema else {
        return; // a boolean schema evaluates in constant time
    };
    if map.contains_key(INTERRUPT_KEYWORD) {
        return; // reached twice (a $ref target inside the tree)
    }
    for (key, value) in map.iter_mut() {
        let key = key.as_str();
        if ONE_SCHEMA.contains(&key) && value.is_object() {
            add_to_schema(value);
        }
        if SCHEMA_ARRAYS.contains(&key)
            && let Value::Array(items) = value
        {
            items.iter_mut().for_each(add_to_schema);
        }
        if SCHEMA_MAPS.contains(&key)
            && let Value::Object(entries) = value
        {
            entries.values_mut().for_each(add_to_schema);
        }
    }
    map.insert(INTERRUPT_KEYWORD.to_string(), Value::Bool(true));
}

/// Objects anywhere outside data that carry an identifier a `$ref` can name.
fn add_to_identified(value: &mut Value, keys_are_names: bool) {
    match value {
        Value::Object(map) => {
            let identified = !keys_are_names
                && ["$id", "$anchor", "$dynamicAnchor"]
                    .iter()
                    .any(|k| map.contains_key(*k));
            if identified && !map.contains_key(INTERRUPT_KEYWORD) {
                add_to_schema(value);
            }
            let Value::Object(map) = value else {
                unreachable!("still an object")
            };
            for (key, child) in map.iter_mut() {
                if keys_are_names || !DATA.contains(&key.as_str()) {
                    add_to_identified(
                        child,
                        !keys_are_names && SCHEMA_MAPS.contains(&key.as_str()),
                    );
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| add_to_identified(i, false)),
        _ => {}
    }
}

/// Every `"$ref": "#/…"` outside data, as a JSON pointer (`#` itself is the root, marked anyway).
fn collect_refs(value: &Value, keys_are_names: bool, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                if !keys_are_names
                    && (key == "$ref" || key == "$dynamicRef")
                    && let Some(r) = child.as_str()
                    && let Some(pointer) = r.strip_prefix('#')
                    && pointer.starts_with('/')
                {
                    out.push(decode_fragment(pointer));
                }
                if keys_are_names || !DATA.contains(&key.as_str()) {
                    collect_refs(
                        child,
                        !keys_are_names && SCHEMA_MAPS.contains(&key.as_str()),
                        out,
                    );
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_refs(i, false, out)),
        _ => {}
    }
}

/// A URI fragment's percent-encoding undone (a JSON pointer in a `$ref` is a URI fragment).
fn decode_fragment(fragment: &str) -> String {
    let bytes = fragment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a JSON pointer passes through a data keyword (a $ref into an `enum` value: the value
/// must stay as it is). A segment under a map of schemas is a name, not a keyword.
fn inside_data(pointer: &str) -> bool {
    let mut keys_are_names = false;
    for segment in pointer.split('/').skip(1) {
        if !keys_are_names && DATA.contains(&segment) {
            return true;
        }
        keys_are_names = !keys_are_names && SCHEMA_MAPS.contains(&segment);
    }
    false
}
