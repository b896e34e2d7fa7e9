//! Tokenizer and chat template read from a GGUF file's metadata.
//!
//! Owned by the bundled-engine work: builds a `tokenizers` BPE from
//! `tokenizer.ggml.tokens` + `tokenizer.ggml.merges`.

use std::path::Path;

use super::{RenderError, TokenizerSource};

pub fn load_tokenizer(path: &Path) -> Result<TokenizerSource, RenderError> {
    Err(RenderError::Load {
        path: path.display().to_string(),
        message: "GGUF tokenizers are not supported yet".into(),
    })
}
