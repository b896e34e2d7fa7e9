//! The chat templates tito ships (`templates/` in the repository, compiled
//! into the binary), selected by name in `[model] chat_template`; any other
//! value is a path to a template file. docs/configuration.md says what each
//! one is for.

/// (name, template text).
pub const SHIPPED: &[(&str, &str)] = &[
    (
        "qwen3-keep-think",
        include_str!("../../templates/qwen3-keep-think.jinja"),
    ),
    (
        "llama3.1-tools",
        include_str!("../../templates/llama3.1-tools.jinja"),
    ),
];

/// The shipped template called `name`.
pub fn by_name(name: &str) -> Option<&'static str> {
    SHIPPED.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The shipped names, for error messages.
pub fn names() -> String {
    SHIPPED
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}
