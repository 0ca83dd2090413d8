//! Compiling a contract's JSON Schema so that validating a result always ends, soon.
//!
//! Validation is pure Rust (the `jsonschema` crate) and never returns to PostgreSQL until it is
//! done. Most schemas validate in microseconds, but applicators nest: a `$ref` inside `anyOf` or
//! `allOf` may evaluate its target twice, and each level of nesting doubles the work, so a 2 kB
//! schema can keep a backend busy for minutes on one result, holding the job's row lock, and
//! collecting the errors of such a result can take gigabytes. Three things bound it:
//!
//! 1. **Interrupts.** Before compiling, every *schema position* of the document — the root, and
//!    what the applicators of draft 2020-12 (and their older spellings) hold — gets one more
//!    keyword, [`INTERRUPT_KEYWORD`], whose check services PostgreSQL's pending interrupts and
//!    always passes. Only schema positions: a key added to a map of property names, or to an
//!    `enum` value, would change what validates.
//! 2. **References stay on schema positions.** Every re-evaluation passes through a `$ref` (or
//!    `$dynamicRef`), and the schema is refused unless each one points at a schema position —
//!    by a `#` fragment, an anchor, or the `$id` of a schema position of the same document — and
//!    unless every `$dynamicAnchor` sits on one. A reference into data, into a map of names or
//!    under an unknown keyword would be evaluated as a schema without any check, and with another
//!    meaning than the one it has where it stands.
//! 3. **Linear regular expressions.** Patterns run on the `regex` engine, which matches in linear
//!    time; a pattern that needs backtracking (back-references, look-around) is refused.
//!
//! Collecting the errors of an invalid result is budgeted ([`with_error_budget`]): past the
//! budget the result is still rejected, with one error that says the details were too many.

use serde_json::Value;
use std::cell::Cell;
use std::collections::{HashMap, HashSet};

/// The keyword added to every schema position.
pub const INTERRUPT_KEYWORD: &str = "x-pg-intent-interrupt-check";

/// Compiles a schema (draft 2020-12) with interrupt checks in every schema position, after
/// checking that its references stay on schema positions.
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    let mut marked = schema.clone();
    let positions = mark(&mut marked)?;
    positions.check_references()?;
    jsonschema::draft202012::options()
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .with_keyword(INTERRUPT_KEYWORD, |_, _, _| Ok(Box::new(InterruptCheck)))
        .build(&marked)
        .map_err(|e| e.to_string())
}

/// Compiles a schema as given, without interrupt checks: to tell whether it is valid at all
/// (its error messages then speak of the user's schema, not of the keyword added to it).
pub fn check_valid(schema: &Value) -> Result<(), String> {
    jsonschema::draft202012::options()
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(schema)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

thread_local! {
    /// How many more schema positions error collection may visit (None: no budget).
    static BUDGET: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The payload of the panic that ends an error collection past its budget.
struct OverBudget;

/// Runs `f` (an error collection) allowing it `visits` visits of schema positions; None when it
/// needed more. PostgreSQL errors (a cancel) and other panics go on unwinding.
pub fn with_error_budget<R>(visits: usize, f: impl FnOnce() -> R) -> Option<R> {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            BUDGET.set(None);
        }
    }
    BUDGET.set(Some(visits));
    let _reset = Reset;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(payload) if payload.is::<OverBudget>() => None,
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

struct InterruptCheck;

impl InterruptCheck {
    fn visit(&self) {
        pgrx::check_for_interrupts!();
        if let Some(left) = BUDGET.get() {
            if left == 0 {
                // Caught by with_error_budget, below every frame of the crate.
                std::panic::resume_unwind(Box::new(OverBudget));
            }
            BUDGET.set(Some(left - 1));
        }
    }
}

impl<'i> jsonschema::Keyword<'i> for InterruptCheck {
    fn validate(&self, _instance: &'i Value) -> Result<(), jsonschema::ValidationError<'i>> {
        self.visit();
        Ok(())
    }

    fn is_valid(&self, _instance: &'i Value) -> bool {
        self.visit();
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
/// Keywords whose value is a map of schemas, keyed by names (`dependencies`: schemas or arrays).
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// What the walk over the schema positions found.
#[derive(Default)]
struct Positions {
    /// JSON pointers (from the document's root) of every schema position.
    schemas: HashSet<String>,
    /// Absolute `$id` → pointer of the schema that declares it.
    ids: HashMap<String, String>,
    /// (base URI, anchor) → pointer, for `$anchor` and `$dynamicAnchor`.
    anchors: HashMap<(String, String), String>,
    /// Every `$ref` and `$dynamicRef` on a schema position, with the base URI it is read against.
    references: Vec<(String, String)>,
    /// Pointers of every object that carries `$dynamicAnchor`, anywhere in the document.
    dynamic_anchors: Vec<String>,
}

fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// Marks every schema position of `schema` and records what [`Positions`] holds.
fn mark(schema: &mut Value) -> Result<Positions, String> {
    let mut positions = Positions::default();
    find_dynamic_anchors(schema, String::new(), &mut positions.dynamic_anchors);
    walk(schema, String::new(), String::new(), &mut positions)?;
    Ok(positions)
}

fn walk(value: &mut Value, pointer: String, base: String, p: &mut Positions) -> Result<(), String> {
    let map = match value {
        Value::Object(map) => map,
        Value::Bool(_) => {
            p.schemas.insert(pointer);
            return Ok(());
        }
        // Not a schema; the crate will say so.
        _ => return Ok(()),
    };
    let mut base = base;
    if let Some(id) = map.get("$id").and_then(Value::as_str) {
        if !is_absolute(id) {
            return Err(format!(
                "$id \"{id}\" at \"{pointer}\" is relative: pg_intent only follows absolute $id URIs (a URN or a full URL)"
            ));
        }
        base = id.trim_end_matches('#').to_string();
        p.ids.insert(base.clone(), pointer.clone());
    }
    for anchor in ["$anchor", "$dynamicAnchor"] {
        if let Some(name) = map.get(anchor).and_then(Value::as_str) {
            p.anchors
                .insert((base.clone(), name.to_string()), pointer.clone());
        }
    }
    for reference in ["$ref", "$dynamicRef"] {
        if let Some(r) = map.get(reference).and_then(Value::as_str) {
            p.references.push((base.clone(), r.to_string()));
        }
    }
    for (key, child) in map.iter_mut() {
        let here = format!("{pointer}/{}", escape(key));
        let key = key.as_str();
        if ONE_SCHEMA.contains(&key) && (child.is_object() || child.is_boolean()) {
            walk(child, here.clone(), base.clone(), p)?;
        }
        if SCHEMA_ARRAYS.contains(&key)
            && let Value::Array(items) = child
        {
            for (i, item) in items.iter_mut().enumerate() {
                walk(item, format!("{here}/{i}"), base.clone(), p)?;
            }
        }
        if SCHEMA_MAPS.contains(&key)
            && let Value::Object(entries) = child
        {
            for (name, entry) in entries.iter_mut() {
                if entry.is_object() || entry.is_boolean() {
                    walk(entry, format!("{here}/{}", escape(name)), base.clone(), p)?;
                }
            }
        }
    }
    p.schemas.insert(pointer);
    map.insert(INTERRUPT_KEYWORD.to_string(), Value::Bool(true));
    Ok(())
}

fn find_dynamic_anchors(value: &Value, pointer: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if map.contains_key("$dynamicAnchor") {
                out.push(pointer.clone());
            }
            for (key, child) in map {
                find_dynamic_anchors(child, format!("{pointer}/{}", escape(key)), out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                find_dynamic_anchors(item, format!("{pointer}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// A URI with a scheme (`urn:…`, `https://…`).
fn is_absolute(uri: &str) -> bool {
    match uri.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }
        None => false,
    }
}

/// A URI fragment's percent-encoding undone.
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

impl Positions {
    /// Every reference must land on a schema position, and every `$dynamicAnchor` sit on one.
    fn check_references(&self) -> Result<(), String> {
        for pointer in &self.dynamic_anchors {
            if !self.schemas.contains(pointer) {
                return Err(format!(
                    "$dynamicAnchor at \"{pointer}\" is not on a schema: put it in $defs"
                ));
            }
        }
        for (base, reference) in &self.references {
            let target = self.resolve(base, reference)?;
            if !self.schemas.contains(&target) {
                return Err(format!(
                    "$ref \"{reference}\" points at \"{target}\", which is not a schema (it is data, a map of names, or under a keyword that holds no schema): put what it refers to in $defs"
                ));
            }
        }
        Ok(())
    }

    /// The pointer a reference names, read against `base`.
    fn resolve(&self, base: &str, reference: &str) -> Result<String, String> {
        let (uri, fragment) = match reference.split_once('#') {
            Some((u, f)) => (u, f),
            None => (reference, ""),
        };
        let resource = if uri.is_empty() {
            base.to_string()
        } else if is_absolute(uri) {
            uri.to_string()
        } else {
            return Err(format!(
                "$ref \"{reference}\" is relative to a URI: pg_intent only follows references within the schema (a # fragment, an anchor, or an absolute $id of the schema)"
            ));
        };
        let root = if resource.is_empty() {
            String::new()
        } else {
            self.ids.get(&resource).cloned().ok_or_else(|| {
                format!(
                    "$ref \"{reference}\" names \"{resource}\", which is not the $id of a schema in this document (remote schemas are never fetched)"
                )
            })?
        };
        let fragment = decode_fragment(fragment);
        if fragment.is_empty() {
            Ok(root)
        } else if fragment.starts_with('/') {
            Ok(format!("{root}{fragment}"))
        } else {
            self.anchors
                .get(&(resource.clone(), fragment.clone()))
                .cloned()
                .ok_or_else(|| format!("$ref \"{reference}\" names no anchor of this schema"))
        }
    }
}
