//! Kubernetes' `$(VAR)` references in a container's `command`, `args` and `env` values, with its rules: a
//! reference to a variable the container defines is replaced by its value; one to an undefined variable is
//! left as written; `$$` is a literal `$` (so `$$(VAR)` is the text `$(VAR)`); an unclosed `$(` stays as it
//! is. An env value sees the variables defined before it in the list; command and args see them all.

use crate::manifest::EnvVar;

/// `input` with its references replaced through `lookup` (`None`: undefined, left as written).
pub fn expand<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        match after.chars().next() {
            // A `$` at the very end stays.
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after.find(')') {
                Some(close) => {
                    let name = &after[1..close];
                    match lookup(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(c) => {
                out.push('$');
                out.push(c);
                rest = &after[c.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The container's environment with each value expanded against the variables defined before it.
pub fn environment(env: &[EnvVar]) -> Vec<(String, String)> {
    let values: Vec<(String, EnvValue)> = env
        .iter()
        .map(|e| (e.name.clone(), EnvValue::Literal(e.value.clone())))
        .collect();
    environment_of(&values)
}

/// One variable's value: written in the manifest (references in it expand), or read from a ConfigMap or
/// Secret (taken as it is, as Kubernetes does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    Literal(String),
    Resolved(String),
}

/// As [`environment`], for values some of which were read from elsewhere.
pub fn environment_of(env: &[(String, EnvValue)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(env.len());
    for (name, v) in env {
        let value = match v {
            EnvValue::Literal(text) => expand(text, |n| lookup(&out, n)),
            EnvValue::Resolved(text) => text.clone(),
        };
        // A later definition of a name wins, as in the container's environment.
        out.retain(|(n, _)| n != name);
        out.push((name.clone(), value));
    }
    out
}

/// `items` (a command or args) expanded against the container's environment.
pub fn expand_all(items: &[String], env: &[(String, String)]) -> Vec<String> {
    items
        .iter()
        .map(|i| expand(i, |name| lookup(env, name)))
        .collect()
}

fn lookup<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<EnvVar> {
        pairs
            .iter()
            .map(|(n, v)| EnvVar {
                name: n.to_string(),
                value: v.to_string(),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn references_follow_kubernetes_rules() {
        let vars = [("VAR_A", "A"), ("VAR_B", "B"), ("VAR_EMPTY", "")];
        let look = |n: &str| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        for (input, want) in [
            ("$(VAR_A)", "A"),
            ("___$(VAR_B)___", "___B___"),
            ("$(VAR_A)-$(VAR_B)", "A-B"),
            ("$(VAR_EMPTY)", ""),
            ("$(UNDEFINED)", "$(UNDEFINED)"),
            ("$$(VAR_A)", "$(VAR_A)"),
            ("$$$(VAR_A)", "$A"),
            ("$$$$(VAR_A)", "$$(VAR_A)"),
            ("$$", "$"),
            ("$", "$"),
            ("a$", "a$"),
            ("$VAR_A", "$VAR_A"),
            ("$(VAR_A", "$(VAR_A"),
            ("$()", "$()"),
            ("$(VAR_A)$(", "A$("),
            ("no refs", "no refs"),
            ("é$(VAR_A)é", "éAé"),
            ("$é", "$é"),
        ] {
            assert_eq!(expand(input, look), want, "{input:?}");
        }
    }

    #[test]
    fn env_values_see_the_ones_before_them_and_commands_see_all() {
        let e = environment(&env(&[
            ("GREETING", "Warm greetings to"),
            ("HONORIFIC", "The Most Honorable"),
            ("NAME", "Kubernetes"),
            ("MESSAGE", "$(GREETING) $(HONORIFIC) $(NAME)"),
            ("EARLY", "$(LATER)"),
            ("LATER", "x"),
        ]));
        assert_eq!(
            e[3],
            (
                "MESSAGE".to_string(),
                "Warm greetings to The Most Honorable Kubernetes".to_string()
            )
        );
        assert_eq!(e[4].1, "$(LATER)", "a later variable is not seen");
        assert_eq!(
            expand_all(&["$(MESSAGE)".into(), "$(LATER)".into()], &e),
            ["Warm greetings to The Most Honorable Kubernetes", "x"]
        );
    }
}
