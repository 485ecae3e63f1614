//! What the workspace's manifests say: the binaries it builds and the `imagepipe-bus` features
//! those binaries get.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use toml::Table;

/// The bus crate, whose features select the backends.
const BUS_CRATE: &str = "imagepipe-bus";

/// One workspace member.
#[derive(Debug)]
pub struct Member {
    /// `package.name`.
    pub name: String,
    /// Its binaries: `[[bin]]` names, or the package name for an implicit `src/main.rs`.
    pub bins: Vec<String>,
    /// Whether it is an example under `examples/` (a stage of users' own, with an image of its
    /// own), not a part of the imagepipe image.
    pub example: bool,
    manifest: Table,
}

/// Every member of the workspace rooted at a directory.
#[derive(Debug)]
pub struct Workspace {
    /// By package name.
    pub members: BTreeMap<String, Member>,
    /// `[workspace.dependencies]`, which members inherit with `workspace = true`.
    inherited: Table,
}

impl Workspace {
    /// Reads `root/Cargo.toml` and every member's manifest.
    pub fn load(root: &Path) -> Workspace {
        let manifest = read_toml(&root.join("Cargo.toml"));
        let members = manifest["workspace"]["members"].as_array().expect("workspace.members is a list");
        let members = members
            .iter()
            .map(|member| {
                let dir = member.as_str().expect("a member is a path");
                assert!(!dir.contains('*'), "workspace member {dir:?}: globs are not supported by this test");
                let mut member = Member::load(&root.join(dir));
                member.example = dir.starts_with("examples/");
                (member.name.clone(), member)
            })
            .collect();
        let inherited =
            manifest["workspace"].get("dependencies").and_then(|d| d.as_table()).cloned().unwrap_or_default();
        Workspace { members, inherited }
    }

    /// Every binary of the workspace but the examples', with the package that owns it.
    pub fn bins(&self) -> BTreeMap<String, String> {
        self.members
            .values()
            .filter(|m| !m.example)
            .flat_map(|m| m.bins.iter().map(|bin| (bin.clone(), m.name.clone())))
            .collect()
    }

    /// The `imagepipe-bus` features enabled when the packages owning `bins` are built together
    /// with `--features extra` (Cargo unifies a dependency's features across one build).
    pub fn bus_features(&self, bins: &BTreeSet<String>, extra: &[String]) -> BTreeSet<String> {
        let owners = self.bins();
        let mut features = BTreeSet::new();
        let mut pending: Vec<(String, String)> = Vec::new();
        for bin in bins {
            let package = &owners[bin];
            for (dep, spec) in self.members[package].dependencies(&self.inherited) {
                let Some(dep) = self.members.get(&dep) else { continue };
                if spec.default_features {
                    pending.push((dep.name.clone(), "default".into()));
                }
                pending.extend(spec.features.into_iter().map(|f| (dep.name.clone(), f)));
            }
        }
        for feature in extra {
            let (package, feature) = feature.split_once('/').expect("--features of the image build name a package");
            pending.push((package.to_owned(), feature.to_owned()));
        }
        let mut seen = BTreeSet::new();
        while let Some((package, feature)) = pending.pop() {
            if !seen.insert((package.clone(), feature.clone())) {
                continue;
            }
            if package == BUS_CRATE {
                features.insert(feature.clone());
            }
            let Some(member) = self.members.get(&package) else { continue };
            for enabled in member.feature(&feature) {
                match enabled.split_once('/') {
                    Some((dep, feature)) => pending.push((dep.trim_end_matches('?').to_owned(), feature.to_owned())),
                    None if enabled.starts_with("dep:") => {}
                    None => pending.push((package.clone(), enabled)),
                }
            }
        }
        features.remove("default");
        features
    }

    /// The features `imagepipe-bus` declares.
    pub fn bus_feature_names(&self) -> BTreeSet<String> {
        self.members[BUS_CRATE]
            .manifest
            .get("features")
            .and_then(|f| f.as_table())
            .map_or_else(BTreeSet::new, |features| features.keys().cloned().collect())
    }
}

/// How a member depends on a workspace crate.
struct DependencySpec {
    default_features: bool,
    features: Vec<String>,
}

impl Member {
    fn load(dir: &Path) -> Member {
        let manifest = read_toml(&dir.join("Cargo.toml"));
        let name = manifest["package"]["name"].as_str().expect("package.name").to_owned();
        let mut bins: Vec<String> = manifest
            .get("bin")
            .and_then(|b| b.as_array())
            .map(|bins| bins.iter().map(|b| b["name"].as_str().expect("[[bin]] name").to_owned()).collect())
            .unwrap_or_default();
        if bins.is_empty() && dir.join("src/main.rs").is_file() {
            bins.push(name.clone());
        }
        Member { name, bins, example: false, manifest }
    }

    /// `[dependencies]` (not dev or build dependencies: they do not reach the binaries); a
    /// dependency with `workspace = true` takes `default-features` from `inherited` unless it
    /// sets its own.
    fn dependencies(&self, inherited: &Table) -> Vec<(String, DependencySpec)> {
        let Some(deps) = self.manifest.get("dependencies").and_then(|d| d.as_table()) else { return Vec::new() };
        let default_features = |spec: &toml::Value| {
            spec.get("default-features").or_else(|| spec.get("default_features")).and_then(|d| d.as_bool())
        };
        deps.iter()
            .map(|(name, spec)| {
                let from_workspace = spec.get("workspace").and_then(|w| w.as_bool()) == Some(true);
                let default_features = default_features(spec)
                    .or_else(|| from_workspace.then(|| inherited.get(name).and_then(default_features)).flatten())
                    .unwrap_or(true);
                let mut features = features_of(spec);
                if from_workspace && let Some(inherited) = inherited.get(name) {
                    features.extend(features_of(inherited));
                }
                (name.clone(), DependencySpec { default_features, features })
            })
            .collect()
    }

    /// What the feature `name` enables (nothing for an unknown feature or an optional dependency).
    fn feature(&self, name: &str) -> Vec<String> {
        self.manifest
            .get("features")
            .and_then(|f| f.get(name))
            .and_then(|f| f.as_array())
            .map(|f| f.iter().filter_map(|f| f.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    }
}

/// The `features` list of a dependency specification.
fn features_of(spec: &toml::Value) -> Vec<String> {
    spec.get("features")
        .and_then(|f| f.as_array())
        .map(|f| f.iter().filter_map(|f| f.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

fn read_toml(path: &PathBuf) -> Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.parse().unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}
