//! Compiling a contract's JSON Schema so that its validation can be interrupted.
//!
//! Validation is pure Rust (the `jsonschema` crate) and never returns to PostgreSQL until it is
//! done. Most schemas validate in microseconds, but applicators nest: a `$ref` inside `anyOf` or
//! `allOf` may evaluate its target twice, and each level of nesting doubles the work, so a 2 kB
//! schema can keep a backend busy for minutes on one result — holding the job's row lock. A
//! cancel or `statement_timeout` must stop it like any other statement.
//!
//! So before compiling, every object of the schema that can be evaluated as a schema gets one
//! more keyword, [`INTERRUPT_KEYWORD`], whose check services PostgreSQL's pending interrupts
//! (and always passes). Every re-evaluation goes through such an object, so the work between two
//! checks is bounded by the size of one object, not by the nesting. The keyword goes into every
//! object reachable from the root — under applicators, `$defs`, unknown keywords (a `$ref` may
//! point anywhere, by a fragment or by an `$id`) — except where adding a key would change what
//! the schema means:
//!
//! - the values of `enum`, `const`, `default` and `examples`, which are data;
//! - maps whose keys are names rather than keywords (`properties`, `patternProperties`, `$defs`,
//!   `definitions`, `dependentSchemas`, `dependencies`): the keyword would be a property; their
//!   values are schemas and get it;
//! - maps whose values are not schemas (`dependentRequired`, `$vocabulary`).
//!
//! A `$ref` to a map of names evaluates that map as a schema whose keywords are the names: such
//! a node is not marked, and its work is constant (its children are marked).

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

/// Keywords whose value is a map of schemas, keyed by names.
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];
/// Keywords whose value is a map of something other than schemas.
const OTHER_MAPS: &[&str] = &["dependentRequired", "$vocabulary"];
/// Keywords whose value is data, never a schema.
const DATA: &[&str] = &["enum", "const", "default", "examples"];

/// Adds the interrupt check to every object of `schema` that can be evaluated as a schema (see
/// the module comment).
pub fn add_checks(schema: &mut Value) {
    visit(schema, false);
}

/// `names`: the object's keys are names (a map of schemas), not keywords.
fn visit(value: &mut Value, names: bool) {
    match value {
        Value::Object(map) if names => map.values_mut().for_each(|v| visit(v, false)),
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                let key = key.as_str();
                if DATA.contains(&key) || OTHER_MAPS.contains(&key) {
                    continue;
                }
                visit(child, SCHEMA_MAPS.contains(&key));
            }
            map.entry(INTERRUPT_KEYWORD).or_insert(Value::Bool(true));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| visit(v, false)),
        _ => {}
    }
}
