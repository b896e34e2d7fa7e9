//! Python literals read into JSON, for the formats whose values are Python
//! (`pythonic` calls, and the `ast.literal_eval` fallback of the XML
//! formats): strings in either quote style (escapes, `r` / `u` prefixes,
//! triple quotes, adjacent strings joined), ints (`0x` / `0o` / `0b`,
//! underscores), floats, a sign on a number, `True` / `False` / `None`, lists
//! and dicts with str / int / bool / None keys, nested. Must not: evaluate
//! anything (names, calls, operators, tuples, sets and bytes are errors).

use serde_json::{Map, Number, Value as Json};

/// Deeper nesting is an error (keeps the recursion bounded).
const MAX_DEPTH: usize = 128;

/// `s` must be exactly one literal, whitespace around it allowed.
pub fn literal_exact(s: &str) -> Result<Json, String> {
    let mut r = Reader::new(s);
    let v = r.value()?;
    r.skip_ws();
    if r.at_end() {
        Ok(v)
    } else {
        Err(format!(
            "unexpected text after a literal: {:?}",
            super::json::short(r.rest())
        ))
    }
}

/// A cursor over Python source text.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    s: &'a str,
    pos: usize,
}

fn ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

impl<'a> Reader<'a> {
    pub fn new(s: &'a str) -> Self {
        Reader { s, pos: 0 }
    }

    pub fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }

    pub fn at_end(&self) -> bool {
        self.pos >= self.s.len()
    }

    pub fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    /// Consumes `c` when it comes next.
    pub fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    /// Skips whitespace, line continuations and `#` comments (as inside
    /// brackets, where newlines do not end a statement).
    pub fn skip_ws(&mut self) {
        loop {
            let rest = self.rest();
            let t = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0c']);
            self.pos += rest.len() - t.len();
            if let Some(after) = t.strip_prefix("\\\n") {
                self.pos = self.s.len() - after.len();
            } else if t.starts_with('#') {
                self.pos += t.find('\n').unwrap_or(t.len());
            } else {
                return;
            }
        }
    }

    /// An identifier, or `None` (nothing consumed).
    pub fn ident(&mut self) -> Option<&'a str> {
        let rest = self.rest();
        if !rest.chars().next().is_some_and(ident_start) {
            return None;
        }
        let len = rest.find(|c: char| !ident_char(c)).unwrap_or(rest.len());
        self.pos += len;
        Some(&rest[..len])
    }

    /// One literal value.
    pub fn value(&mut self) -> Result<Json, String> {
        self.value_at(0)
    }

    fn value_at(&mut self, depth: usize) -> Result<Json, String> {
        if depth > MAX_DEPTH {
            return Err("literal nested too deeply".into());
        }
        self.skip_ws();
        match self.peek() {
            None => Err("expected a value, found the end".into()),
            Some('[') => self.list(depth),
            Some('{') => self.dict(depth),
            Some('"' | '\'') => self.strings(),
            Some('-' | '+') => {
                let neg = self.peek() == Some('-');
                self.pos += 1;
                self.skip_ws();
                match self.peek() {
                    Some(c) if c.is_ascii_digit() || c == '.' => self.number(neg),
                    _ => Err("a sign must be followed by a number".into()),
                }
            }
            Some(c) if c.is_ascii_digit() || c == '.' => self.number(false),
            Some(c) if ident_start(c) => {
                let save = self.pos;
                let word = self.ident().unwrap_or("");
                match word {
                    "True" => Ok(Json::Bool(true)),
                    "False" => Ok(Json::Bool(false)),
                    "None" => Ok(Json::Null),
                    "r" | "R" | "u" | "U" if matches!(self.peek(), Some('"' | '\'')) => {
                        self.pos = save;
                        self.strings()
                    }
                    _ => Err(format!("{:?} is not a literal", super::json::short(word))),
                }
            }
            Some(c) => Err(format!("unexpected {c:?} where a value should be")),
        }
    }

    fn list(&mut self, depth: usize) -> Result<Json, String> {
        self.eat('[');
        let mut items = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(']') {
                return Ok(Json::Array(items));
            }
            items.push(self.value_at(depth + 1)?);
            self.skip_ws();
            if !self.eat(',') && self.peek() != Some(']') {
                return Err("expected ',' or ']' in a list".into());
            }
        }
    }

    fn dict(&mut self, depth: usize) -> Result<Json, String> {
        self.eat('{');
        let mut map = Map::new();
        loop {
            self.skip_ws();
            if self.eat('}') {
                return Ok(Json::Object(map));
            }
            let key = match self.value_at(depth + 1)? {
                Json::String(s) => s,
                Json::Bool(b) => b.to_string(),
                Json::Null => "null".into(),
                Json::Number(n) if !n.is_f64() => n.to_string(),
                _ => return Err("dict keys must be str, int, bool or None".into()),
            };
            self.skip_ws();
            if !self.eat(':') {
                return Err("expected ':' after a dict key".into());
            }
            let v = self.value_at(depth + 1)?;
            map.insert(key, v);
            self.skip_ws();
            if !self.eat(',') && self.peek() != Some('}') {
                return Err("expected ',' or '}' in a dict".into());
            }
        }
    }

    /// One string literal, or several adjacent ones joined.
    fn strings(&mut self) -> Result<Json, String> {
        let mut out = self.string()?;
        loop {
            let save = self.pos;
            self.skip_ws();
            let raw_prefix = matches!(self.peek(), Some('r' | 'R' | 'u' | 'U'))
                && matches!(self.rest()[1..].chars().next(), Some('"' | '\''));
            if matches!(self.peek(), Some('"' | '\'')) || raw_prefix {
                out.push_str(&self.string()?);
            } else {
                self.pos = save;
                return Ok(Json::String(out));
            }
        }
    }

    fn string(&mut self) -> Result<String, String> {
        let mut raw = false;
        if let Some(p @ ('r' | 'R' | 'u' | 'U')) = self.peek() {
            raw = matches!(p, 'r' | 'R');
            self.pos += 1;
        }
        let rest = self.rest();
        let Some(q) = rest.chars().next().filter(|c| matches!(c, '"' | '\'')) else {
            return Err("expected a string".into());
        };
        let triple: String = [q, q, q].iter().collect();
        let long = rest.starts_with(&triple);
        self.pos += if long { 3 } else { 1 };
        let mut out = String::new();
        loop {
            let rest = self.rest();
            let mut chars = rest.chars();
            let Some(c) = chars.next() else {
                return Err("unterminated string".into());
            };
            if long && rest.starts_with(&triple) {
                self.pos += 3;
                return Ok(out);
            }
            if !long && c == q {
                self.pos += 1;
                return Ok(out);
            }
            if !long && c == '\n' {
                return Err("unterminated string (newline in a one-line string)".into());
            }
            self.pos += c.len_utf8();
            if c != '\\' {
                out.push(c);
                continue;
            }
            let Some(e) = chars.next() else {
                return Err("unterminated string".into());
            };
            self.pos += e.len_utf8();
            if raw {
                out.push('\\');
                out.push(e);
                continue;
            }
            match e {
                '\n' => {}
                '\\' | '\'' | '"' => out.push(e),
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'a' => out.push('\x07'),
                'b' => out.push('\x08'),
                'f' => out.push('\x0c'),
                'v' => out.push('\x0b'),
                '0'..='7' => {
                    let more: String = chars
                        .take_while(|c| matches!(c, '0'..='7'))
                        .take(2)
                        .collect();
                    self.pos += more.len();
                    let code = u32::from_str_radix(&format!("{e}{more}"), 8).unwrap_or(0);
                    out.push(char::from_u32(code).ok_or("bad octal escape")?);
                }
                'x' | 'u' | 'U' => {
                    let n = match e {
                        'x' => 2,
                        'u' => 4,
                        _ => 8,
                    };
                    let hex = self.rest().get(..n).unwrap_or("");
                    if hex.len() != n || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(format!("truncated \\{e} escape"));
                    }
                    self.pos += n;
                    let code = u32::from_str_radix(hex, 16).unwrap_or(u32::MAX);
                    let ch = char::from_u32(code)
                        .ok_or_else(|| format!("\\{e}{hex} is not a character"))?;
                    out.push(ch);
                }
                'N' => return Err("\\N{...} escapes are not supported".into()),
                other => {
                    out.push('\\');
                    out.push(other);
                }
            }
        }
    }

    fn number(&mut self, neg: bool) -> Result<Json, String> {
        let tok = number_token(self.rest());
        self.pos += tok.len();
        if self.peek().is_some_and(ident_char) {
            return Err(format!("bad number {:?}", super::json::short(tok)));
        }
        let sign = if neg { "-" } else { "" };
        let lower = tok.to_ascii_lowercase();
        let (radix, digits) = match lower.get(..2) {
            Some("0x") => (16, &lower[2..]),
            Some("0o") => (8, &lower[2..]),
            Some("0b") => (2, &lower[2..]),
            _ => (10, lower.as_str()),
        };
        let clean = underscores(digits, radix)?;
        let is_float = radix == 10 && clean.contains(['.', 'e']);
        if is_float {
            let f: f64 = format!("{sign}{clean}")
                .parse()
                .map_err(|_| format!("bad number {:?}", super::json::short(tok)))?;
            return Number::from_f64(f)
                .map(Json::Number)
                .ok_or_else(|| "float out of range".into());
        }
        if radix == 10 && clean.len() > 1 && clean.starts_with('0') && clean.contains(|c| c != '0')
        {
            return Err("leading zeros in an integer".into());
        }
        let n = i128::from_str_radix(&clean, radix)
            .map_err(|_| format!("bad number {:?}", super::json::short(tok)))?;
        let n = if neg { -n } else { n };
        if let Ok(i) = i64::try_from(n) {
            Ok(Json::from(i))
        } else if let Ok(u) = u64::try_from(n) {
            Ok(Json::from(u))
        } else {
            Err("integer out of range".into())
        }
    }
}

/// The longest prefix of `rest` that is a number token: digits, letters,
/// `_`, `.`, and a sign right after an exponent `e` of a decimal.
fn number_token(rest: &str) -> &str {
    let bytes = rest.as_bytes();
    let hex = rest.len() > 1 && bytes[0] == b'0' && matches!(bytes[1], b'x' | b'X');
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let sign_ok =
            !hex && matches!(b, b'+' | b'-') && i > 0 && matches!(bytes[i - 1], b'e' | b'E');
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || sign_ok {
            i += 1;
        } else {
            break;
        }
    }
    &rest[..i]
}

/// `digits` without its underscores; each must sit between two digits.
fn underscores(digits: &str, radix: u32) -> Result<String, String> {
    let b = digits.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'_' {
            let ok = |j: Option<&u8>| j.is_some_and(|d| (*d as char).is_digit(radix));
            if !ok(i.checked_sub(1).and_then(|j| b.get(j))) || !ok(b.get(i + 1)) {
                return Err("misplaced '_' in a number".into());
            }
        }
    }
    let clean: String = digits.chars().filter(|&c| c != '_').collect();
    if clean.is_empty() {
        return Err("empty number".into());
    }
    Ok(clean)
}
