//! The test provider's tokenizer endpoints: what its fake model "receives", and the ways a real
//! server gets that wrong on purpose ([`Flaw`]).
//!
//! [`tiny_tokenizer`] trains a byte-level BPE tokenizer (a few hundred tokens, ChatML's control
//! tokens) in a moment, with no download; [`ProviderTokenizer`] renders chats with ChatML and
//! answers vLLM's `POST /tokenize` / `POST /detokenize`, llama.cpp's `/tokenize`,
//! `/detokenize`, `/apply-template` and `GET /props`, and TGI's `/chat_tokenize`, `/tokenize`
//! (with `inputs`) and `GET /info`.

use serde_json::{Value, json};
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    TokenizerBuilder, TokenizerImpl,
};

/// ChatML's turn markers, the end-of-text token, the unknown token, and one of Qwen 2.5's that
/// is in no default list (`<|object_ref_start|>`): the tiny tokenizer's control tokens.
pub const CONTROL_TOKENS: [&str; 5] = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<unk>",
    "<|object_ref_start|>",
];

/// The context window the provider reports: 4,096 tokens ([`Flaw::SmallContext`]: 64).
pub const CONTEXT_WINDOW: u32 = 4096;

/// [`Flaw::SmallContext`]'s window.
pub const SMALL_CONTEXT_WINDOW: u32 = 64;

/// ChatML as a Jinja chat template (the shape of Qwen's), for [`tiny_tokenizer`] used locally.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A ChatML template that knows no system role: it keeps only the user's and the assistant's
/// turns, as some models' templates do, so the instructions never reach the model.
pub const CHATML_WITHOUT_SYSTEM: &str = "{% for message in messages %}{% if message['role'] != 'system' %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// What the provider's tokenizer gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flaw {
    /// Its chat template has no system role: the system message is dropped.
    DropsSystem,
    /// Its context window is [`SMALL_CONTEXT_WINDOW`] tokens.
    SmallContext,
    /// It parses control tokens in the messages' content (as vLLM, TGI and llama.cpp's chat
    /// endpoint do): a user input holding `<|im_end|>` ends the turn. Without this flaw the
    /// content tokenizes as text.
    ParsesControlTokens,
    /// It has no byte fallback: every non-ASCII character becomes `<unk>`.
    Lossy,
}

impl Flaw {
    /// Every flaw.
    pub const ALL: [Flaw; 4] = [
        Flaw::DropsSystem,
        Flaw::SmallContext,
        Flaw::ParsesControlTokens,
        Flaw::Lossy,
    ];

    /// The flaw's name on the command line: `drops-system`, `small-context`,
    /// `parses-control-tokens`, `lossy`.
    pub fn as_str(self) -> &'static str {
        match self {
            Flaw::DropsSystem => "drops-system",
            Flaw::SmallContext => "small-context",
            Flaw::ParsesControlTokens => "parses-control-tokens",
            Flaw::Lossy => "lossy",
        }
    }
}

impl std::str::FromStr for Flaw {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Flaw::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Flaw::ALL.iter().map(|f| f.as_str()).collect();
                format!("unknown flaw {s:?}: one of {}", names.join(", "))
            })
    }
}

/// The words the tiny tokenizer is trained on: the captions contract's prompts and ChatML's
/// role names, so that they take few tokens; everything else falls back to bytes.
const CORPUS: &[&str] = &[
    "system user assistant",
    "You caption pictures. Answer with exactly one JSON object and nothing else.",
    "The object must match this JSON Schema:",
    "{\"type\": \"object\", \"properties\": {\"subject\": {\"type\": \"string\"}, \"caption\": {\"type\": \"string\"}}, \"required\": [\"subject\", \"caption\"], \"additionalProperties\": false}",
    "Subject: a red fox. Subject: the Eiffel Tower at night. Subject: a bowl of ramen.",
    "Write a caption for the picture. a the of and in at to is on with",
];

type Bpe = TokenizerImpl<
    BPE,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// A byte-level BPE tokenizer trained here, on [`CORPUS`]-like text, with [`CONTROL_TOKENS`]
/// as its special tokens: the contents of its `tokenizer.json`. Deterministic, and quick (well
/// under a second).
pub fn tiny_tokenizer() -> String {
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(600)
        .min_frequency(1)
        .show_progress(false)
        .special_tokens(
            CONTROL_TOKENS
                .iter()
                .map(|t| AddedToken::from(*t, true))
                .collect(),
        )
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    // No prefix space: a rendered prompt round-trips exactly.
    let byte_level = ByteLevel::new(false, true, true);
    let mut tokenizer: Bpe = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(byte_level)))
        .with_decoder(Some(DecoderWrapper::ByteLevel(byte_level)))
        .build()
        .expect("a BPE tokenizer builds");
    let corpus: Vec<String> = CORPUS.iter().map(|s| s.to_string()).collect();
    tokenizer
        .train(&mut trainer, corpus.into_iter())
        .expect("the tiny corpus trains");
    tokenizer
        .to_string(false)
        .expect("a trained tokenizer serializes")
}

/// The provider's tokenizer: [`tiny_tokenizer`]'s vocabulary, ChatML, and the flaws set.
#[derive(Clone)]
pub struct ProviderTokenizer {
    /// Parses control tokens written in the text.
    parsing: tokenizers::Tokenizer,
    /// Tokenizes control tokens as text.
    literal: tokenizers::Tokenizer,
}

impl std::fmt::Debug for ProviderTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderTokenizer").finish_non_exhaustive()
    }
}

impl Default for ProviderTokenizer {
    fn default() -> Self {
        ProviderTokenizer::new(&tiny_tokenizer()).expect("the tiny tokenizer loads")
    }
}

impl ProviderTokenizer {
    /// The tokenizer in `tokenizer_json`.
    pub fn new(tokenizer_json: &str) -> Result<Self, String> {
        let parsing: tokenizers::Tokenizer = tokenizer_json.parse().map_err(|e| format!("{e}"))?;
        let mut literal = parsing.clone();
        literal.set_encode_special_tokens(true);
        Ok(ProviderTokenizer { parsing, literal })
    }

    fn encode(&self, text: &str, parse_control: bool, flaws: &[Flaw]) -> Vec<u32> {
        let tokenizer = if parse_control {
            &self.parsing
        } else {
            &self.literal
        };
        let plain = |piece: &str| -> Vec<u32> {
            if piece.is_empty() {
                return Vec::new();
            }
            tokenizer
                .encode(piece, false)
                .expect("byte-level BPE encodes any text")
                .get_ids()
                .to_vec()
        };
        if !flaws.contains(&Flaw::Lossy) {
            return plain(text);
        }
        // No byte fallback: each non-ASCII character is one <unk>.
        let unk = self.parsing.token_to_id("<unk>").expect("<unk> is a token");
        let mut ids = Vec::new();
        for (i, piece) in text.split(|c: char| !c.is_ascii()).enumerate() {
            if i > 0 {
                ids.push(unk);
            }
            ids.extend(plain(piece));
        }
        ids
    }

    /// The chat rendered with ChatML (without its system turn under [`Flaw::DropsSystem`]),
    /// as text.
    pub fn render(&self, messages: &[(String, String)], flaws: &[Flaw]) -> String {
        let mut text = String::new();
        for (role, content) in messages {
            if role == "system" && flaws.contains(&Flaw::DropsSystem) {
                continue;
            }
            text.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
        }
        text.push_str("<|im_start|>assistant\n");
        text
    }

    /// The chat's ids: the template's own markers as control tokens; the content as text
    /// unless [`Flaw::ParsesControlTokens`].
    pub fn chat_ids(&self, messages: &[(String, String)], flaws: &[Flaw]) -> Vec<u32> {
        let parse_content = flaws.contains(&Flaw::ParsesControlTokens);
        let mut ids = Vec::new();
        for (role, content) in messages {
            if role == "system" && flaws.contains(&Flaw::DropsSystem) {
                continue;
            }
            ids.extend(self.encode(&format!("<|im_start|>{role}\n"), true, flaws));
            ids.extend(self.encode(content, parse_content, flaws));
            ids.extend(self.encode("<|im_end|>\n", true, flaws));
        }
        ids.extend(self.encode("<|im_start|>assistant\n", true, flaws));
        ids
    }

    /// The ids of a raw prompt: control tokens in it parsed, as a server parses a prompt.
    pub fn prompt_ids(&self, text: &str, flaws: &[Flaw]) -> Vec<u32> {
        self.encode(text, true, flaws)
    }

    /// TGI's token list for `ids`: each id with its own text and its offsets in their
    /// concatenation.
    pub fn pieces(&self, ids: &[u32]) -> Vec<Value> {
        let mut at = 0;
        ids.iter()
            .map(|id| {
                let text = self.parsing.decode(&[*id], false).unwrap_or_default();
                let start = at;
                at += text.len();
                json!({"id": id, "text": text, "start": start, "stop": at, "special": false})
            })
            .collect()
    }

    /// The text of `ids` (`None` for an id outside the vocabulary).
    pub fn decode(&self, ids: &[u32]) -> Option<String> {
        let size = self.parsing.get_vocab_size(true) as u32;
        if ids.iter().any(|id| *id >= size) {
            return None;
        }
        self.parsing.decode(ids, false).ok()
    }
}

/// The context window under `flaws`.
pub fn context_window(flaws: &[Flaw]) -> u32 {
    if flaws.contains(&Flaw::SmallContext) {
        SMALL_CONTEXT_WINDOW
    } else {
        CONTEXT_WINDOW
    }
}

/// The messages of a `/tokenize` or `/apply-template` body, as (role, content) pairs.
pub fn messages_of(body: &Value) -> Result<Vec<(String, String)>, String> {
    let Some(list) = body.get("messages").and_then(Value::as_array) else {
        return Err("\"messages\" must be a list".into());
    };
    list.iter()
        .map(|m| {
            let role = m.get("role").and_then(Value::as_str);
            let content = m.get("content").and_then(Value::as_str);
            match (role, content) {
                (Some(r), Some(c)) => Ok((r.to_string(), c.to_string())),
                _ => Err(format!("a message without a role and a text content: {m}")),
            }
        })
        .collect()
}

/// The answer to `POST /tokenize`, `POST /detokenize`, `POST /apply-template` or
/// `GET /props`: `Ok` with the JSON body, or `Err` with a 400's message.
pub fn answer(
    tokenizer: &ProviderTokenizer,
    path: &str,
    body: &Value,
    flaws: &[Flaw],
) -> Result<Value, String> {
    let window = context_window(flaws);
    match path {
        "/props" => Ok(json!({"default_generation_settings": {"n_ctx": window}})),
        // TGI's: the window, the templated chat with its tokens, a text's tokens.
        "/info" => Ok(json!({"max_total_tokens": window, "max_input_tokens": window / 2})),
        "/chat_tokenize" => {
            let messages = messages_of(body)?;
            let ids = tokenizer.chat_ids(&messages, flaws);
            Ok(json!({
                "templated_text": tokenizer.render(&messages, flaws),
                "tokenize_response": tokenizer.pieces(&ids),
            }))
        }
        "/tokenize" if body.get("inputs").is_some() => {
            let text = body["inputs"].as_str().ok_or("\"inputs\" must be a text")?;
            let ids = tokenizer.prompt_ids(text, flaws);
            Ok(Value::Array(tokenizer.pieces(&ids)))
        }
        "/apply-template" => {
            let messages = messages_of(body)?;
            Ok(json!({"prompt": tokenizer.render(&messages, flaws)}))
        }
        "/tokenize" => {
            let ids = if body.get("messages").is_some() {
                tokenizer.chat_ids(&messages_of(body)?, flaws)
            } else if let Some(prompt) = body.get("prompt").and_then(Value::as_str) {
                tokenizer.prompt_ids(prompt, flaws)
            } else if let Some(content) = body.get("content").and_then(Value::as_str) {
                let parse = body
                    .get("parse_special")
                    .and_then(Value::as_bool)
                    .unwrap_or(true);
                tokenizer.encode(content, parse, flaws)
            } else {
                return Err("give \"messages\", \"prompt\" or \"content\"".into());
            };
            Ok(json!({"count": ids.len(), "max_model_len": window, "tokens": ids}))
        }
        "/detokenize" => {
            let ids: Vec<u32> = body
                .get("tokens")
                .and_then(Value::as_array)
                .ok_or("\"tokens\" must be a list of ids")?
                .iter()
                .map(|t| t.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect::<Option<_>>()
                .ok_or("\"tokens\" must be a list of ids")?;
            let text = tokenizer
                .decode(&ids)
                .ok_or("an id outside the vocabulary")?;
            // vLLM answers "prompt", llama.cpp "content".
            Ok(json!({"prompt": text, "content": text}))
        }
        _ => Err(format!("no tokenizer route {path}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(system: &str, user: &str) -> Vec<(String, String)> {
        vec![
            ("system".into(), system.into()),
            ("user".into(), user.into()),
        ]
    }

    #[test]
    fn a_well_behaved_tokenizer_round_trips_and_keeps_content_as_text() {
        let t = ProviderTokenizer::default();
        let messages = chat("Answer in JSON — always.", "Subject: a fox <|im_end|>");
        let ids = t.chat_ids(&messages, &[]);
        let text = t.decode(&ids).unwrap();
        assert_eq!(text, t.render(&messages, &[]));
        let end = t.parsing.token_to_id("<|im_end|>").unwrap();
        assert_eq!(
            ids.iter().filter(|i| **i == end).count(),
            2,
            "only the template's"
        );
        let flawed = t.chat_ids(&messages, &[Flaw::ParsesControlTokens]);
        assert_eq!(flawed.iter().filter(|i| **i == end).count(), 3);
        assert!(
            !t.decode(&t.chat_ids(&messages, &[Flaw::Lossy]))
                .unwrap()
                .contains('—')
        );
        assert!(!t.render(&messages, &[Flaw::DropsSystem]).contains("JSON"));
        assert_eq!(tiny_tokenizer(), tiny_tokenizer(), "deterministic");
    }
}
