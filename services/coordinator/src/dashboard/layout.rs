//! The frame every page shares: head, navigation, the live-update hook and the message area.

use axum::response::Html;
use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::access::Viewer;
use super::assets;

/// The dashboard's sections, as the navigation lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// `/`.
    Overview,
    /// `/tasks` and a task's page.
    Tasks,
    /// `/search`.
    Search,
    /// `/dlq`.
    DeadLetters,
}

impl Section {
    const ALL: [Section; 4] = [Self::Overview, Self::Tasks, Self::Search, Self::DeadLetters];

    fn href(self) -> &'static str {
        match self {
            Self::Overview => "/",
            Self::Tasks => "/tasks",
            Self::Search => "/search",
            Self::DeadLetters => "/dlq",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Overview => "Overview",
            Self::Tasks => "Tasks",
            Self::Search => "Search",
            Self::DeadLetters => "Dead letters",
        }
    }
}

/// Every event type, comma separated: the names the page listens for on `/v1/events`.
fn event_types() -> String {
    imagepipe_contracts::EventType::ALL.map(imagepipe_contracts::EventType::as_str).join(",")
}

fn head(title: &str) -> Markup {
    html! {
        meta charset="utf-8";
        meta name="viewport" content="width=device-width, initial-scale=1";
        meta name="referrer" content="same-origin";
        title { (title) " · imagepipe" }
        link rel="stylesheet" href=(assets::url("app.css"));
        link rel="icon" href=(assets::url("icon.svg")) type="image/svg+xml";
        script src=(assets::url("app.js")) defer {}
    }
}

/// A whole page: `body` under the navigation with `active` marked. `live` names what the script
/// refreshes on events (`overview`, `rows`, `task:<id>`), if anything.
pub fn page(title: &str, viewer: &Viewer, active: Section, live: Option<&str>, body: Markup) -> Html<String> {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                (head(title))
                @if let Some(csrf) = &viewer.csrf { meta name="csrf-token" content=(csrf); }
            }
            body data-live=[live] data-event-types=(event_types()) {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    a.brand href="/" aria-label="imagepipe overview" { (PreEscaped(assets::LOGO)) span { "imagepipe" } }
                    nav aria-label="Sections" {
                        ul {
                            @for section in Section::ALL {
                                li {
                                    a href=(section.href()) aria-current=[(section == active).then_some("page")] { (section.label()) }
                                }
                            }
                        }
                    }
                    span.live-state role="status" aria-live="polite" data-live-state { "" }
                    @if let Some(csrf) = &viewer.csrf {
                        form.logout method="post" action="/logout" {
                            input type="hidden" name="csrf" value=(csrf);
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main id="main" tabindex="-1" { (body) }
                div.toasts role="status" aria-live="polite" data-toasts {}
            }
        }
    };
    Html(markup.into_string())
}

/// A page without navigation (login, refusals).
pub fn bare(title: &str, body: Markup) -> Html<String> {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head { (head(title)) }
            body.bare { main id="main" { (body) } }
        }
    };
    Html(markup.into_string())
}

/// A notice that part of a page could not be had, naming why.
pub fn unavailable(what: &str, error: &imagepipe_runtime::http::ApiError) -> Markup {
    html! {
        p.notice role="note" { (what) " unavailable: " (error.message) }
    }
}
