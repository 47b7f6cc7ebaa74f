//! Real text as training data (`--data text --text FILE…`): the files are read, concatenated in the
//! order given (a newline between two files), and turned into token ids once, by a Hugging Face
//! `tokenizer.json` (`--tokenizer`, loaded with the `tokenizers` crate, the ecosystem's own) or,
//! without one, one token per byte. Batches are windows of T + 1 tokens at seeded random offsets.

use std::path::Path;
use tokenizers::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("--text {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("--tokenizer {path}: not a Hugging Face tokenizer.json ({reason})")]
    Tokenizer { path: String, reason: String },
    #[error("--tokenizer: tokenizing the text failed: {0}")]
    Encode(String),
    #[error("the text has {len} tokens; a sequence needs at least T + 1 = {need}")]
    TooShort { len: usize, need: usize },
    #[error("token id {id} of the tokenizer is outside the vocabulary of {vocab}: raise --vocab")]
    OutOfVocab { id: u32, vocab: u32 },
}

/// Loads a `tokenizer.json`.
pub fn load_tokenizer(path: &str) -> Result<Tokenizer, TextError> {
    if !Path::new(path).is_file() {
        return Err(TextError::Tokenizer { path: path.into(), reason: "no such file".into() });
    }
    Tokenizer::from_file(path).map_err(|e| TextError::Tokenizer { path: path.into(), reason: e.to_string() })
}

/// Tokenized text: the ids, and the id(s) of a newline (the text's delimiter).
pub struct TextTokens {
    pub ids: Vec<u32>,
    pub newline: Vec<u32>,
}

/// The token ids of `paths` concatenated, by `tokenizer` or as bytes, checked against `vocab`.
pub fn tokens(paths: &[String], tokenizer: Option<&str>, vocab: u32, seq: usize) -> Result<Vec<u32>, TextError> {
    tokenize(paths, tokenizer, vocab, seq).map(|t| t.ids)
}

/// As [`tokens`], with the newline's ids kept (by the same tokenizer, loaded once).
pub fn tokenize(paths: &[String], tokenizer: Option<&str>, vocab: u32, seq: usize) -> Result<TextTokens, TextError> {
    let mut text = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        if i > 0 {
            text.push(b'\n');
        }
        text.extend(std::fs::read(path).map_err(|source| TextError::Read { path: path.clone(), source })?);
    }
    let (ids, newline): (Vec<u32>, Vec<u32>) = match tokenizer {
        None => (text.into_iter().map(u32::from).collect(), vec![u32::from(b'\n')]),
        Some(t) => {
            let tk = load_tokenizer(t)?;
            let s = String::from_utf8_lossy(&text);
            // Line by line: a tokenizer's pre-tokenizer splits on whitespace anyway, and lines
            // keep each call small. The newline itself is encoded after each line.
            let mut ids = Vec::with_capacity(s.len() / 3);
            let newline = tk.encode("\n", false).map_err(|e| TextError::Encode(e.to_string()))?.get_ids().to_vec();
            let lines: Vec<&str> = s.split('\n').collect();
            let encoded = tk.encode_batch(lines, false).map_err(|e| TextError::Encode(e.to_string()))?;
            for (i, e) in encoded.iter().enumerate() {
                if i > 0 {
                    ids.extend_from_slice(&newline);
                }
                ids.extend_from_slice(e.get_ids());
            }
            (ids, newline)
        }
    };
    if ids.len() < seq + 1 {
        return Err(TextError::TooShort { len: ids.len(), need: seq + 1 });
    }
    if let Some(&id) = ids.iter().find(|&&id| id >= vocab) {
        return Err(TextError::OutOfVocab { id, vocab });
    }
    Ok(TextTokens { ids, newline })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> String {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    #[test]
    fn bytes_are_tokens_and_files_join_with_a_newline() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.txt", "ab");
        let b = write(d.path(), "b.txt", "c");
        assert_eq!(tokens(&[a.clone(), b], None, 256, 2).unwrap(), vec![97, 98, 10, 99]);
        assert!(matches!(tokens(std::slice::from_ref(&a), None, 256, 2), Err(TextError::TooShort { len: 2, need: 3 })));
        assert!(matches!(tokens(&[a], None, 98, 1), Err(TextError::OutOfVocab { id: 98, vocab: 98 })));
    }

    #[test]
    fn a_tokenizer_json_gives_the_ids_hugging_face_tokenizers_gives() {
        // The ids Python's `tokenizers` (0.23) gives for this sentence with the same file.
        let tok = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tokenizer/fortunes-bpe-512.json");
        let d = tempfile::tempdir().unwrap();
        let f = write(d.path(), "s.txt", "The quick brown fox jumps over the lazy dog.");
        let want = [313, 220, 431, 302, 74, 269, 81, 308, 77, 275, 78, 87, 450, 403, 79, 82, 277, 314, 262, 289, 64, 89, 88, 361, 70, 13];
        assert_eq!(tokens(&[f], Some(tok), 512, 4).unwrap(), want);
    }

    #[test]
    fn a_missing_tokenizer_or_text_is_named() {
        let e = tokens(&["/nonexistent.txt".into()], None, 256, 1).unwrap_err().to_string();
        assert!(e.starts_with("--text /nonexistent.txt"), "{e}");
        let d = tempfile::tempdir().unwrap();
        let bad = write(d.path(), "tok.json", "{\"not\": \"a tokenizer\"}");
        let e = load_tokenizer(&bad).unwrap_err().to_string();
        assert!(e.contains("not a Hugging Face tokenizer.json"), "{e}");
    }
}
