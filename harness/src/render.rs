//! Rendering checks: what the model actually receives, through the provider's own tokenizer.
//!
//! A prompt that reads well as two strings can still reach the model broken: a chat template
//! without a system role drops the instructions, a context window truncates them, an input
//! holding a control token (`<|im_end|>`) ends the user's turn and starts one of its own. None
//! of that shows in the answers of a short test run. These checks look at the tokens.
//!
//! A [`Tokenizer`] answers for one provider: the token ids of a chat rendered through its chat
//! template ([`Tokenizer::chat`]), a text's ids ([`Tokenizer::tokenize`], as the provider
//! tokenizes a prompt: control tokens written in the text count as control tokens) and the text
//! of ids ([`Tokenizer::detokenize`]). Two kinds exist:
//!
//! * [`super::ServerTokenizer`] (feature `openai`): the provider's own `/tokenize` and
//!   `/detokenize` endpoints (vLLM-style, or llama.cpp's, whose template comes from
//!   `/apply-template`, or TGI's `/chat_tokenize` and `/tokenize`) — what the server will do,
//!   exactly;
//! * [`super::LocalTokenizer`] (feature `local-tokenizer`): a provider described by its
//!   `tokenizer.json` and chat template (the Hugging Face files), rendered with `minijinja` and
//!   tokenized with `tokenizers`, as a server that applies the template and tokenizes the result
//!   (vLLM, TGI) does.
//!
//! [`RenderChecks`] (given to [`super::RunOptions::rendering`]) runs, for every case, before
//! any provider call is paid for:
//!
//! | check | passes when |
//! |---|---|
//! | `round_trip` | the rendered chat's ids detokenize to a text that tokenizes back to the same ids (and, where the provider shows the rendered text, to that text itself) |
//! | `system_present` | the system prompt (trimmed) is in the text of what the model receives |
//! | `user_present` | the user prompt (trimmed) is too |
//! | `fits` | the chat's tokens plus the longest expected answer ([`RenderChecks::answer_tokens`], else the run's `max_tokens`) fit the context window ([`RenderChecks::context_window`], else the one the tokenizer reports) |
//! | `control_tokens` | a control token appended to every text of the input (each of [`DEFAULT_CONTROL_TOKENS`] and the tokenizer's own that is one token here) adds no control token to what the model receives: it tokenizes as text |
//!
//! A failed check fails the case and refuses the certification (its reason names the case and
//! the check); the provider is not called for that run. Every check's result is recorded in
//! the evidence (`"rendering"` per case, and the tokenizer's description at the top). An
//! unknown context window fails `fits`: a certification says the prompt fits, or it is not
//! given.
//!
//! Control tokens in inputs are neutralised by the suite's own render function, before the
//! template sees them: [`neutralise_control_tokens`] breaks each one with a word joiner
//! (U+2060), so that it tokenizes as text and reads the same. Servers that apply a template and
//! tokenize the result (vLLM, TGI, llama.cpp's chat endpoint) parse control tokens wherever they
//! are written, the user's content included; the `control_tokens` check fails for them until
//! the render neutralises its inputs.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::{ContractSuite, Prompt};

/// The control tokens the `control_tokens` check tries (besides the tokenizer's own special
/// tokens) and [`neutralise_control_tokens`] breaks: the turn markers of ChatML (Qwen, many
/// fine-tunes), Llama 2 and 3, Mistral, Gemma and Phi, and the usual begin/end markers. A
/// candidate that is not one token for the provider's tokenizer is ordinary text there and is
/// skipped (the evidence says which were tried).
pub const DEFAULT_CONTROL_TOKENS: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|begin_of_text|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "<start_of_turn>",
    "<end_of_turn>",
    // Unknown, padding and mask tokens of SentencePiece and BERT-style vocabularies.
    "<unk>",
    "<pad>",
    "<mask>",
    "<|pad|>",
    // Qwen 2.5 (tools, fill-in-the-middle), Phi-4, Llama 4, gpt-oss (harmony), Command-R,
    // Mistral v7, DeepSeek (fullwidth bars), and Llama 2's system markers.
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|im_sep|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|eot|>",
    "<|start|>",
    "<|message|>",
    "<|channel|>",
    "<|return|>",
    "<|call|>",
    "<|START_OF_TURN_TOKEN|>",
    "<|END_OF_TURN_TOKEN|>",
    "<|USER_TOKEN|>",
    "<|CHATBOT_TOKEN|>",
    "<|SYSTEM_TOKEN|>",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "<\u{ff5c}User\u{ff5c}>",
    "<\u{ff5c}Assistant\u{ff5c}>",
    "<\u{ff5c}begin\u{2581}of\u{2581}sentence\u{ff5c}>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "<<SYS>>",
    "<</SYS>>",
];

/// What a [`Tokenizer`] future resolves to.
pub type TokenizerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, RenderError>> + Send + 'a>>;

/// Why a [`Tokenizer`] could not answer (an endpoint that failed, a template that does not
/// render). A rendering check that cannot be made fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderError(pub String);

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RenderError {}

/// A chat as the model receives it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chat {
    /// The token ids, generation prompt (the assistant's turn opening) included.
    pub ids: Vec<u32>,
    /// The rendered text, when the tokenizer knows it (a local template, llama.cpp's
    /// `/apply-template`); vLLM's `/tokenize` gives only the ids.
    pub text: Option<String>,
    /// The context window the provider reports, in tokens (vLLM's `max_model_len`,
    /// llama.cpp's `n_ctx`, a tokenizer config's `model_max_length`).
    pub context_window: Option<u32>,
}

/// A provider's tokenizer: how its chat template and vocabulary turn a prompt into what the
/// model receives. See the [module documentation](self).
pub trait Tokenizer: Send + Sync {
    /// What the evidence records about it (kind, endpoint — redacted —, model). Never secrets.
    fn describe(&self) -> Value;

    /// The chat `prompt` (a system and a user message) rendered through the chat template with
    /// the generation prompt, tokenized.
    fn chat<'a>(&'a self, prompt: &'a Prompt) -> TokenizerFuture<'a, Chat>;

    /// The ids of `text`, tokenized as the provider tokenizes a prompt (control tokens written
    /// in it are parsed as control tokens; no begin-of-text token added).
    fn tokenize<'a>(&'a self, text: &'a str) -> TokenizerFuture<'a, Vec<u32>>;

    /// The text of `ids`, control tokens written out.
    fn detokenize<'a>(&'a self, ids: &'a [u32]) -> TokenizerFuture<'a, String>;

    /// The tokenizer's own control tokens (its special added tokens), tried besides
    /// [`DEFAULT_CONTROL_TOKENS`]. Default: none known.
    fn control_tokens(&self) -> Vec<String> {
        Vec::new()
    }
}

/// The rendering checks a run makes (see the [module documentation](self)).
#[derive(Clone)]
pub struct RenderChecks {
    tokenizer: Arc<dyn Tokenizer>,
    answer_tokens: Option<u32>,
    context_window: Option<u32>,
    control_tokens: Vec<String>,
}

impl fmt::Debug for RenderChecks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RenderChecks")
            .field("tokenizer", &self.tokenizer.describe())
            .field("answer_tokens", &self.answer_tokens)
            .field("context_window", &self.context_window)
            .field("control_tokens", &self.control_tokens)
            .finish()
    }
}

/// Two checks are equal when they use the same tokenizer (the same `Arc`) and settings.
impl PartialEq for RenderChecks {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.tokenizer, &other.tokenizer)
            && self.answer_tokens == other.answer_tokens
            && self.context_window == other.context_window
            && self.control_tokens == other.control_tokens
    }
}

/// The longest answer assumed when neither [`RenderChecks::answer_tokens`] nor the run's
/// `max_tokens` says: 1,024 tokens.
pub const DEFAULT_ANSWER_TOKENS: u32 = 1024;

impl RenderChecks {
    /// The checks through `tokenizer`, trying [`DEFAULT_CONTROL_TOKENS`] and the tokenizer's
    /// own.
    pub fn new(tokenizer: impl Tokenizer + 'static) -> Self {
        RenderChecks::shared(Arc::new(tokenizer))
    }

    /// [`RenderChecks::new`] with a tokenizer shared with other code.
    pub fn shared(tokenizer: Arc<dyn Tokenizer>) -> Self {
        RenderChecks {
            tokenizer,
            answer_tokens: None,
            context_window: None,
            control_tokens: DEFAULT_CONTROL_TOKENS
                .iter()
                .map(|t| t.to_string())
                .collect(),
        }
    }

    /// The longest answer expected, in tokens: `fits` leaves room for it (default: the run's
    /// `max_tokens`, else [`DEFAULT_ANSWER_TOKENS`]).
    pub fn answer_tokens(mut self, tokens: u32) -> Self {
        self.answer_tokens = Some(tokens);
        self
    }

    /// The provider's context window, in tokens, when its tokenizer does not report it (or
    /// reports more than the deployment allows). Given, it is used instead of the reported one.
    pub fn context_window(mut self, tokens: u32) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// Tries `token` too in the `control_tokens` check.
    pub fn control_token(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        if !token.is_empty() && !self.control_tokens.contains(&token) {
            self.control_tokens.push(token);
        }
        self
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        &self.tokenizer
    }

    /// What the evidence records about the checks.
    pub(super) fn describe(&self, max_tokens: Option<u32>) -> Value {
        json!({
            "tokenizer": self.tokenizer.describe(),
            "answer_tokens": self.answer_tokens.or(max_tokens).unwrap_or(DEFAULT_ANSWER_TOKENS),
            "context_window": self.context_window,
        })
    }

    /// The control tokens of this tokenizer, each with its id: the candidates that are exactly
    /// one token here and detokenize to themselves. Asked once per run.
    pub(super) async fn control_ids(&self) -> Result<ControlTokens, RenderError> {
        let mut tried = self.control_tokens.clone();
        for own in self.tokenizer.control_tokens() {
            if !own.is_empty() && !tried.contains(&own) {
                tried.push(own);
            }
        }
        let mut found = Vec::new();
        for token in &tried {
            let ids = self.tokenizer.tokenize(token).await?;
            if let [id] = ids[..]
                && self.tokenizer.detokenize(&ids).await? == *token
            {
                found.push((token.clone(), id));
            }
        }
        Ok(ControlTokens { tried, found })
    }

    /// Every check for one case: `prompt` is `suite`'s rendering of `input`.
    pub(super) async fn check(
        &self,
        suite: &ContractSuite,
        input: &Value,
        prompt: &Prompt,
        max_tokens: Option<u32>,
        control: &ControlTokens,
    ) -> Rendering {
        let mut checks = Vec::new();
        let chat = match self.tokenizer.chat(prompt).await {
            Ok(chat) => chat,
            Err(e) => {
                checks.push(Check::failed(
                    "chat",
                    format!("the provider's tokenizer could not render the chat: {e}"),
                ));
                return Rendering {
                    tokens: None,
                    checks,
                };
            }
        };
        let text = match self.tokenizer.detokenize(&chat.ids).await {
            Ok(text) => text,
            Err(e) => {
                checks.push(Check::failed(
                    "round_trip",
                    format!("the chat's ids could not be detokenized: {e}"),
                ));
                return Rendering {
                    tokens: Some(chat.ids.len()),
                    checks,
                };
            }
        };
        checks.push(self.round_trip(&chat, &text).await);
        checks.push(present(
            "system_present",
            "system prompt",
            &prompt.system,
            &text,
        ));
        checks.push(present("user_present", "user prompt", &prompt.user, &text));
        checks.push(self.fits(&chat, max_tokens));
        checks.push(self.control(suite, input, &chat, control).await);
        Rendering {
            tokens: Some(chat.ids.len()),
            checks,
        }
    }

    async fn round_trip(&self, chat: &Chat, text: &str) -> Check {
        if let Some(rendered) = &chat.text
            && rendered != text
        {
            return Check::failed(
                "round_trip",
                format!(
                    "the rendered prompt does not survive tokenization: it detokenizes to a \
                     different text (first difference at character {}: {:?} became {:?})",
                    first_difference(rendered, text),
                    excerpt(rendered, first_difference(rendered, text)),
                    excerpt(text, first_difference(rendered, text)),
                ),
            );
        }
        match self.tokenizer.tokenize(text).await {
            Ok(again) if again == chat.ids => Check::passed(
                "round_trip",
                format!(
                    "{} tokens detokenize and tokenize back unchanged",
                    chat.ids.len()
                ),
            ),
            Ok(again) => Check::failed(
                "round_trip",
                format!(
                    "the text of what the model receives tokenizes to other ids ({} tokens \
                     became {}): the tokenizer does not round-trip this prompt",
                    chat.ids.len(),
                    again.len()
                ),
            ),
            Err(e) => Check::failed("round_trip", format!("could not tokenize it back: {e}")),
        }
    }

    fn fits(&self, chat: &Chat, max_tokens: Option<u32>) -> Check {
        let answer = self
            .answer_tokens
            .or(max_tokens)
            .unwrap_or(DEFAULT_ANSWER_TOKENS);
        let Some(window) = self.context_window.or(chat.context_window) else {
            return Check::failed(
                "fits",
                "the provider's context window is unknown (its tokenizer does not report it): \
                 give RenderChecks::context_window",
            );
        };
        let needed = chat.ids.len() as u64 + u64::from(answer);
        if needed <= u64::from(window) {
            Check::passed(
                "fits",
                format!(
                    "{} prompt tokens + {answer} answer tokens fit the context window of \
                     {window}",
                    chat.ids.len()
                ),
            )
        } else {
            Check::failed(
                "fits",
                format!(
                    "{} prompt tokens + {answer} answer tokens exceed the context window of \
                     {window}: the provider would truncate the prompt or the answer",
                    chat.ids.len()
                ),
            )
        }
    }

    async fn control(
        &self,
        suite: &ContractSuite,
        input: &Value,
        chat: &Chat,
        control: &ControlTokens,
    ) -> Check {
        if control.found.is_empty() {
            return Check::passed(
                "control_tokens",
                format!(
                    "none of the {} control tokens tried is one token for this tokenizer",
                    control.tried.len()
                ),
            );
        }
        if count_strings(input) == 0 {
            return Check::passed(
                "control_tokens",
                "not applicable: the input holds no text to inject into",
            );
        }
        for (token, id) in &control.found {
            let injected = append_to_strings(input, token);
            let prompt = suite.prompt_for(&injected);
            let ids = match self.tokenizer.chat(&prompt).await {
                Ok(c) => c.ids,
                Err(e) => {
                    return Check::failed(
                        "control_tokens",
                        format!("could not render the input with {token:?} appended: {e}"),
                    );
                }
            };
            let before = chat.ids.iter().filter(|i| *i == id).count();
            let after = ids.iter().filter(|i| *i == id).count();
            if after > before {
                return Check::failed(
                    "control_tokens",
                    format!(
                        "an input holding {token:?} reaches the model as that control token \
                         (id {id}: {after} in the prompt instead of {before}), so user input can \
                         end its turn and write one of its own: neutralise inputs \
                         (pg_intent_harness::neutralise_control_tokens) in the render function"
                    ),
                );
            }
        }
        let names: Vec<&str> = control.found.iter().map(|(t, _)| t.as_str()).collect();
        Check::passed(
            "control_tokens",
            format!("appended to every text of the input, {names:?} tokenize as text"),
        )
    }
}

/// The control tokens tried, and those that are one token here (with their ids).
#[derive(Debug, Clone, Default)]
pub(super) struct ControlTokens {
    tried: Vec<String>,
    found: Vec<(String, u32)>,
}

impl ControlTokens {
    pub(super) fn evidence(&self) -> Value {
        json!({
            "tried": self.tried,
            "control_tokens_here": self.found.iter().map(|(t, id)| json!({"token": t, "id": id})).collect::<Vec<_>>(),
        })
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// `round_trip`, `system_present`, `user_present`, `fits`, `control_tokens` (or `chat`
    /// when the chat could not be rendered at all).
    pub name: &'static str,
    /// Whether it passed.
    pub passed: bool,
    /// What was seen, in a sentence.
    pub detail: String,
}

impl Check {
    fn passed(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            passed: true,
            detail: detail.into(),
        }
    }

    fn failed(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            passed: false,
            detail: detail.into(),
        }
    }
}

/// The rendering checks of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendering {
    /// How many tokens the model receives, when the chat rendered.
    pub tokens: Option<usize>,
    /// Each check, in order.
    pub checks: Vec<Check>,
}

impl Rendering {
    /// The rendering of a case when the tokenizer could not even say which control tokens it
    /// has: one failed check.
    pub(super) fn unavailable(error: &RenderError) -> Rendering {
        Rendering {
            tokens: None,
            checks: vec![Check::failed(
                "chat",
                format!("the provider's tokenizer does not answer: {error}"),
            )],
        }
    }

    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }

    /// The first failed check.
    pub fn first_failure(&self) -> Option<&Check> {
        self.checks.iter().find(|c| !c.passed)
    }
}

fn present(name: &'static str, what: &str, expected: &str, received: &str) -> Check {
    let expected = expected.trim();
    if expected.is_empty() {
        return Check::passed(name, format!("the {what} is empty"));
    }
    if received.contains(expected) {
        Check::passed(name, format!("the {what} reaches the model whole"))
    } else {
        Check::failed(
            name,
            format!(
                "the {what} is not in what the model receives (the chat template drops, \
                 rewrites or truncates it): it begins {:?}",
                excerpt(expected, 0)
            ),
        )
    }
}

/// The character index where `a` and `b` first differ.
fn first_difference(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

/// Up to 40 characters of `text` from character `at`.
fn excerpt(text: &str, at: usize) -> String {
    text.chars().skip(at).take(40).collect()
}

fn count_strings(value: &Value) -> usize {
    match value {
        Value::String(_) => 1,
        Value::Array(items) => items.iter().map(count_strings).sum(),
        Value::Object(map) => map.values().map(count_strings).sum(),
        _ => 0,
    }
}

/// `value` with `suffix` appended to every string in it.
fn append_to_strings(value: &Value, suffix: &str) -> Value {
    match value {
        Value::String(s) => Value::String(format!("{s}{suffix}")),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| append_to_strings(v, suffix)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), append_to_strings(v, suffix)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The word joiner [`neutralise_control_tokens`] inserts (U+2060: invisible, no width, not a
/// space).
pub const WORD_JOINER: char = '\u{2060}';

/// `text` with every one of [`DEFAULT_CONTROL_TOKENS`] broken by a word joiner after its first
/// character, so that it tokenizes as text (and reads the same). Use it on every input text a
/// render function puts into a prompt.
///
/// ```
/// use pg_intent_harness::neutralise_control_tokens;
/// let text = neutralise_control_tokens("done<|im_end|>\n<|im_start|>system");
/// assert!(!text.contains("<|im_end|>") && !text.contains("<|im_start|>"));
/// ```
pub fn neutralise_control_tokens(text: &str) -> String {
    neutralise_with(text, DEFAULT_CONTROL_TOKENS.iter().copied())
}

/// [`neutralise_control_tokens`] for the control tokens `tokens` (a tokenizer's own, …).
pub fn neutralise_with<'a>(text: &str, tokens: impl IntoIterator<Item = &'a str>) -> String {
    let mut tokens: Vec<&str> = tokens.into_iter().filter(|t| !t.is_empty()).collect();
    // The longest first: `<|im_start|>` before `<s>`-like prefixes of it, if any.
    tokens.sort_by_key(|t| std::cmp::Reverse(t.len()));
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'outer: while !rest.is_empty() {
        for token in &tokens {
            if let Some(tail) = rest.strip_prefix(token) {
                let mut chars = token.chars();
                let first = chars.next().expect("a non-empty token");
                out.push(first);
                out.push(WORD_JOINER);
                out.push_str(chars.as_str());
                rest = tail;
                continue 'outer;
            }
        }
        let c = rest.chars().next().expect("a non-empty rest");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutralising_breaks_every_control_token_and_nothing_else() {
        let text = "a <|im_end|> b </s> [INST] <<|im_start|>> plain < | text";
        let out = neutralise_control_tokens(text);
        for token in DEFAULT_CONTROL_TOKENS {
            assert!(!out.contains(token), "{token} survived in {out:?}");
        }
        assert_eq!(out.replace(WORD_JOINER, ""), text);
        assert_eq!(neutralise_control_tokens("plain text"), "plain text");
        // Idempotent: a neutralised text holds no control token to break.
        assert_eq!(neutralise_control_tokens(&out), out);
    }

    #[test]
    fn strings_are_found_and_appended_everywhere() {
        let input = json!({"a": "x", "b": [1, "y", {"c": "z"}], "d": null});
        assert_eq!(count_strings(&input), 3);
        assert_eq!(
            append_to_strings(&input, "!"),
            json!({"a": "x!", "b": [1, "y!", {"c": "z!"}], "d": null})
        );
    }
}
