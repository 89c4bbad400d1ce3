//! Which modules a file's code names: its files mapped to module paths, and a syntax-tree
//! visitor that resolves every `crate::`, `super::`, `self::` and child-module path, in `use`
//! trees, in the tree's paths and in macro tokens, outside `#[cfg(test)]` items.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use syn::visit::Visit;

/// A module path: `["db", "nodes"]`; the crate root is empty.
pub(crate) type Module = Vec<String>;

/// Every `.rs` file under `src` by its module (`foo.rs` and `foo/mod.rs` are `foo`; `lib.rs`
/// and `main.rs` are the root).
pub(crate) fn files(src: &Path) -> Result<BTreeMap<Module, PathBuf>, String> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_owned()];
    while let Some(dir) = dirs.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry
                .map_err(|e| format!("reading {}: {e}", dir.display()))?
                .path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(src).unwrap_or(&path).with_extension("");
                let mut module: Module = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if module
                    .last()
                    .is_some_and(|m| matches!(m.as_str(), "mod" | "lib" | "main"))
                {
                    module.pop();
                }
                found.insert(module, path);
            }
        }
    }
    if found.is_empty() {
        return Err("no .rs file".into());
    }
    Ok(found)
}

/// The modules of `known` that the code of `module` (its file's `text`) names, other than
/// itself.
pub(crate) fn named(
    module: &Module,
    text: &str,
    known: &BTreeMap<Module, PathBuf>,
) -> Result<BTreeSet<Module>, String> {
    let file = syn::parse_file(text).map_err(|e| e.to_string())?;
    let children = known
        .keys()
        .filter(|k| k.len() == module.len() + 1 && k.starts_with(module))
        .filter_map(|k| k.last().cloned())
        .collect();
    let mut names = Names {
        file: module.clone(),
        here: module.clone(),
        children,
        known,
        found: BTreeSet::new(),
    };
    names.items(&file.items);
    names.found.remove(module);
    Ok(names.found)
}

struct Names<'a> {
    /// The file's module.
    file: Module,
    /// Where the code being read is: the file's module, or an inline module inside it.
    here: Module,
    /// The file module's children, which its code may name without a prefix.
    children: BTreeSet<String>,
    known: &'a BTreeMap<Module, PathBuf>,
    found: BTreeSet<Module>,
}

impl Names<'_> {
    fn items(&mut self, items: &[syn::Item]) {
        for item in items.iter().filter(|item| !test_only(attributes(item))) {
            self.visit_item(item);
        }
    }

    /// Records the module the path `segments` names, if it starts where a module path does.
    fn path(&mut self, segments: &[String]) {
        let Some((first, rest)) = segments.split_first() else {
            return;
        };
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.here.clone(),
            "super" => self.here[..self.here.len().saturating_sub(1)].to_vec(),
            child if self.here == self.file && self.children.contains(child) => {
                let mut base = self.here.clone();
                base.push(child.to_owned());
                base
            }
            _ => return,
        };
        let mut rest = rest;
        while let Some(("super", more)) = rest.split_first().map(|(s, m)| (s.as_str(), m)) {
            base.pop();
            rest = more;
        }
        base.extend(
            rest.iter()
                .filter(|s| !matches!(s.as_str(), "self" | "*"))
                .cloned(),
        );
        let target = (0..=base.len())
            .rev()
            .map(|n| &base[..n])
            .find(|prefix| self.known.contains_key(*prefix))
            .map(<[String]>::to_vec)
            .unwrap_or_default();
        self.found.insert(target);
    }

    /// Every path a `use` tree names.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.path(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.path(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.path(&prefix.clone()),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// Paths in a macro's tokens: `a::b::c` runs, and `a::{...}` groups read as `use` trees.
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            if let TokenTree::Group(group) = &tokens[i] {
                self.tokens(group.stream());
                i += 1;
                continue;
            }
            let starts = matches!(&tokens[i], TokenTree::Ident(_))
                && !(i >= 2 && path_separator(&tokens[i - 2], &tokens[i - 1]));
            if !starts {
                i += 1;
                continue;
            }
            let mut segments = vec![tokens[i].to_string()];
            let mut j = i + 1;
            while j + 1 < tokens.len() {
                if !path_separator(&tokens[j], &tokens[j + 1]) {
                    break;
                }
                match tokens.get(j + 2) {
                    Some(TokenTree::Ident(next)) => {
                        segments.push(next.to_string());
                        j += 3;
                    }
                    Some(TokenTree::Group(group)) if group.delimiter() == Delimiter::Brace => {
                        let mut tree: TokenStream = tokens[i..j + 2].iter().cloned().collect();
                        tree.extend([TokenTree::Group(group.clone())]);
                        if let Ok(tree) = syn::parse2::<syn::UseTree>(tree) {
                            self.use_tree(&mut Vec::new(), &tree);
                        }
                        segments.clear();
                        j += 3;
                        break;
                    }
                    _ => break,
                }
            }
            if segments.len() > 1 {
                self.path(&segments);
            }
            i = j.max(i + 1);
        }
    }
}

/// `::` as two joint colons.
fn path_separator(a: &TokenTree, b: &TokenTree) -> bool {
    matches!((a, b), (TokenTree::Punct(x), TokenTree::Punct(y))
        if x.as_char() == ':' && x.spacing() == Spacing::Joint && y.as_char() == ':')
}

impl<'ast> Visit<'ast> for Names<'_> {
    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        if let Some((_, items)) = &module.content {
            self.here.push(module.ident.to_string());
            self.items(items);
            self.here.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if item.leading_colon.is_none() {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.path(&segments);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }

    fn visit_block(&mut self, block: &'ast syn::Block) {
        for statement in &block.stmts {
            if let syn::Stmt::Item(item) = statement {
                if test_only(attributes(item)) {
                    continue;
                }
            }
            self.visit_stmt(statement);
        }
    }
}

/// Whether `#[cfg(test)]` is among `attributes`.
fn test_only(attributes: &[syn::Attribute]) -> bool {
    attributes.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Ident>()
                .is_ok_and(|predicate| predicate == "test")
    })
}

/// An item's attributes.
fn attributes(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}
