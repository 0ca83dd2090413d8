//! [`LocalTokenizer`]: a provider described by its Hugging Face files (feature
//! `local-tokenizer`).

use std::fmt;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::Prompt;
use super::render::{Chat, RenderError, Tokenizer, TokenizerFuture};

/// How much work a chat template may do (minijinja's fuel) before it is refused: far above any
/// real template's rendering of two messages.
const TEMPLATE_FUEL: u64 = 1_000_000;

/// A provider's tokenizer described by its files: `tokenizer.json` (the `tokenizers` crate's
/// format) and its chat template (Jinja, as in `tokenizer_config.json`'s `chat_template`),
/// rendered with `minijinja` (Python string methods through `minijinja-contrib`'s `pycompat`).
///
/// It renders the chat as vLLM and TGI do: the template is given `messages` (a `system` and a
/// `user` message), `add_generation_prompt = true`, `bos_token` and `eos_token`, and
/// `raise_exception(message)` fails the render; the rendered text is tokenized as a whole,
/// **control tokens written in it parsed as control tokens** (the `user`'s content included),
/// with no special tokens added (the template writes its own).
///
/// ```
/// # #[cfg(feature = "local-tokenizer")] {
/// # use pg_intent_harness::LocalTokenizer;
/// # fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let tokenizer_json = std::fs::read_to_string("model/tokenizer.json")?;
/// let tokenizer_config_json = std::fs::read_to_string("model/tokenizer_config.json")?;
/// let tokenizer = LocalTokenizer::from_config(&tokenizer_json, &tokenizer_config_json)?
///     .context_window(8192);
/// # let _ = tokenizer;
/// # Ok(()) } }
/// ```
pub struct LocalTokenizer {
    tokenizer: tokenizers::Tokenizer,
    template: String,
    bos_token: String,
    eos_token: String,
    context_window: Option<u32>,
    /// The sha256 of `tokenizer.json` and of the template, for the evidence.
    digests: (String, String),
}

impl fmt::Debug for LocalTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalTokenizer")
            .field("tokenizer_sha256", &self.digests.0)
            .field("template_sha256", &self.digests.1)
            .field("context_window", &self.context_window)
            .finish_non_exhaustive()
    }
}

fn sha256(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A token in `tokenizer_config.json`: a string, or `{"content": "…", …}`.
fn token_of(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

impl LocalTokenizer {
    /// The tokenizer in `tokenizer_json` (the contents of a `tokenizer.json`) with the chat
    /// template `chat_template`. The template is compiled here: one that does not parse is an
    /// error now, not at the first check.
    pub fn new(tokenizer_json: &str, chat_template: &str) -> Result<Self, RenderError> {
        let tokenizer: tokenizers::Tokenizer = tokenizer_json
            .parse()
            .map_err(|e| RenderError(format!("tokenizer.json does not load: {e}")))?;
        environment()
            .template_from_str(chat_template)
            .map_err(|e| RenderError(format!("the chat template does not parse: {e:#}")))?;
        Ok(LocalTokenizer {
            tokenizer,
            template: chat_template.to_string(),
            bos_token: String::new(),
            eos_token: String::new(),
            context_window: None,
            digests: (sha256(tokenizer_json), sha256(chat_template)),
        })
    }

    /// The tokenizer of a Hugging Face model's `tokenizer.json` and `tokenizer_config.json`
    /// (its `chat_template`, `bos_token`, `eos_token` and, below 10⁹, `model_max_length` as the
    /// context window).
    pub fn from_config(
        tokenizer_json: &str,
        tokenizer_config_json: &str,
    ) -> Result<Self, RenderError> {
        let config: Value = serde_json::from_str(tokenizer_config_json)
            .map_err(|e| RenderError(format!("tokenizer_config.json does not parse: {e}")))?;
        let template = match config.get("chat_template") {
            Some(Value::String(t)) => t.clone(),
            // A list of named templates: the default one.
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template").and_then(Value::as_str))
                .map(str::to_string)
                .ok_or_else(|| {
                    RenderError("tokenizer_config.json names no default chat template".into())
                })?,
            _ => {
                return Err(RenderError(
                    "tokenizer_config.json has no chat_template".into(),
                ));
            }
        };
        let mut tokenizer = LocalTokenizer::new(tokenizer_json, &template)?;
        tokenizer.bos_token = token_of(config.get("bos_token"));
        tokenizer.eos_token = token_of(config.get("eos_token"));
        // Models without a limit carry a sentinel (1e30); only a real number is a window.
        tokenizer.context_window = config
            .get("model_max_length")
            .and_then(Value::as_f64)
            .filter(|n| *n >= 1.0 && *n < 1e9)
            .map(|n| n as u32);
        Ok(tokenizer)
    }

    /// The context window, in tokens (the model's `max_position_embeddings`, or what the
    /// deployment allows).
    pub fn context_window(mut self, tokens: u32) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// The begin- and end-of-text tokens the template may write (`bos_token`, `eos_token`).
    pub fn special_tokens(mut self, bos: impl Into<String>, eos: impl Into<String>) -> Self {
        self.bos_token = bos.into();
        self.eos_token = eos.into();
        self
    }

    /// The chat rendered through the template: the text the server tokenizes.
    pub fn render(&self, prompt: &Prompt) -> Result<String, RenderError> {
        let env = environment();
        let template = env
            .template_from_str(&self.template)
            .map_err(|e| RenderError(format!("the chat template does not parse: {e:#}")))?;
        template
            .render(minijinja::context! {
                messages => vec![
                    minijinja::context! { role => "system", content => prompt.system.as_str() },
                    minijinja::context! { role => "user", content => prompt.user.as_str() },
                ],
                add_generation_prompt => true,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(|e| RenderError(format!("the chat template fails: {e:#}")))
    }

    fn ids(&self, text: &str) -> Result<Vec<u32>, RenderError> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| RenderError(format!("the tokenizer fails: {e}")))
    }
}

/// The template environment: Python's string methods, `raise_exception`, bounded fuel.
fn environment() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.add_function(
        "raise_exception",
        |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                format!("the template raised: {message}"),
            ))
        },
    );
    env
}

impl Tokenizer for LocalTokenizer {
    fn describe(&self) -> Value {
        json!({
            "kind": "local",
            "tokenizer_sha256": self.digests.0,
            "chat_template_sha256": self.digests.1,
            "context_window": self.context_window,
        })
    }

    fn chat<'a>(&'a self, prompt: &'a Prompt) -> TokenizerFuture<'a, Chat> {
        Box::pin(async move {
            let text = self.render(prompt)?;
            let ids = self.ids(&text)?;
            Ok(Chat {
                ids,
                text: Some(text),
                context_window: self.context_window,
            })
        })
    }

    fn tokenize<'a>(&'a self, text: &'a str) -> TokenizerFuture<'a, Vec<u32>> {
        Box::pin(async move { self.ids(text) })
    }

    fn detokenize<'a>(&'a self, ids: &'a [u32]) -> TokenizerFuture<'a, String> {
        Box::pin(async move {
            self.tokenizer
                .decode(ids, false)
                .map_err(|e| RenderError(format!("the tokenizer cannot decode: {e}")))
        })
    }

    /// Every added token, `special` or not (an added token is parsed as one token wherever it
    /// is written: Qwen2.5's `<tool_call>` and `<|fim_prefix|>` are not `special`), except
    /// runs of whitespace that some code models add as tokens.
    fn control_tokens(&self) -> Vec<String> {
        self.tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special || !t.content.trim().is_empty())
            .map(|t| t.content)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny `tokenizer.json`: a word-level vocabulary, enough to load.
    fn tokenizer_json() -> String {
        json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 0, "content": "<|im_end|>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"<|im_end|>": 0, "hi": 1, "[UNK]": 2}, "unk_token": "[UNK]"}
        })
        .to_string()
    }

    #[test]
    fn a_template_that_would_run_for_ever_is_stopped_by_its_fuel() {
        let endless = "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}";
        let t = LocalTokenizer::new(&tokenizer_json(), endless).unwrap();
        let started = std::time::Instant::now();
        let err = t.render(&Prompt::default()).unwrap_err();
        assert!(err.0.contains("fuel"), "{err}");
        // Stopped after its fuel, not after 10^10 iterations.
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
        assert!(LocalTokenizer::new(&tokenizer_json(), "{% for %}").is_err());
        assert!(LocalTokenizer::new("not json", "x").is_err());
        assert_eq!(t.control_tokens(), vec!["<|im_end|>".to_string()]);
    }

    #[test]
    fn configs_give_their_template_tokens_and_window() {
        let config = json!({
            "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"}],
            "bos_token": {"content": "<s>"}, "eos_token": "</s>", "model_max_length": 1e30,
        });
        let t = LocalTokenizer::from_config(&tokenizer_json(), &config.to_string()).unwrap();
        let prompt = Prompt {
            system: "hi".into(),
            user: String::new(),
        };
        assert_eq!(t.render(&prompt).unwrap(), "<s>hi");
        assert_eq!(
            t.describe()["context_window"],
            Value::Null,
            "1e30 is no window"
        );
        assert!(LocalTokenizer::from_config(&tokenizer_json(), "{}").is_err());
    }
}
