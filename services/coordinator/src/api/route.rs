//! The API's route table. Each [`Route`] is an [`Operation`] — method, path, the scope it needs
//! and what the OpenAPI document says of it — with its handler: the router is [`mount`]ed from
//! the routes and the document ([`openapi`](super::openapi)) rendered from the same operations,
//! so a route cannot be served without being documented, nor documented with another method or
//! scope than it is served with.

use axum::Router;
use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{MethodFilter, MethodRouter, on};
use imagepipe_runtime::http::{ApiError, Scope, require};
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Map, Value, json};

use super::JSON_BODY_BYTES;

/// The pattern of a task or job id (`is_valid_id`).
pub const ID_PATTERN: &str = "^[A-Za-z0-9_.-]{1,128}$";

/// A schema of the document.
#[derive(Clone)]
pub enum Schema {
    /// A type's, made by the document's generator (which collects the components it refers to).
    Generated(fn(&mut SchemaGenerator) -> Value),
    /// As written.
    Inline(Value),
}

impl Schema {
    /// The schema of `T`: a reference to its component, or inline for a type schemars inlines.
    pub fn of<T: JsonSchema>() -> Self {
        Self::Generated(reference::<T>)
    }

    fn render(&self, generator: &mut SchemaGenerator) -> Value {
        match self {
            Self::Generated(make) => make(generator),
            Self::Inline(schema) => schema.clone(),
        }
    }
}

/// `T`'s schema from `generator`, as JSON.
pub fn reference<T: JsonSchema>(generator: &mut SchemaGenerator) -> Value {
    serde_json::to_value(generator.subschema_for::<T>()).expect("schemas serialize")
}

/// A body of one media type, with an optional example.
#[derive(Clone)]
pub struct Content {
    media: &'static str,
    schema: Schema,
    example: Option<Value>,
}

impl Content {
    /// A body of `media` with `schema`.
    pub fn new(media: &'static str, schema: Schema) -> Self {
        Self { media, schema, example: None }
    }

    /// A JSON body of type `T`.
    pub fn json<T: JsonSchema>() -> Self {
        Self::new("application/json", Schema::of::<T>())
    }

    /// Bytes of `media` (`application/octet-stream`, `image/*`).
    pub fn binary(media: &'static str) -> Self {
        Self::new(media, Schema::Inline(json!({ "type": "string", "format": "binary" })))
    }

    /// Any JSON object (an answer the coordinator forwards without a schema of its own).
    pub fn any_object() -> Self {
        Self::new("application/json", Schema::Inline(json!({ "type": "object" })))
    }

    /// The same body with `example`.
    pub fn example(self, example: Value) -> Self {
        Self { example: Some(example), ..self }
    }

    fn render(&self, generator: &mut SchemaGenerator) -> (String, Value) {
        let mut content = json!({ "schema": self.schema.render(generator) });
        if let Some(example) = &self.example {
            content["example"] = example.clone();
        }
        (self.media.to_owned(), content)
    }
}

fn render_contents(contents: &[Content], generator: &mut SchemaGenerator) -> Value {
    Value::Object(contents.iter().map(|c| c.render(generator)).collect())
}

/// One answer of an operation: its status, what it means, and its body and headers.
#[derive(Clone)]
pub struct Answer {
    status: u16,
    description: String,
    content: Vec<Content>,
    headers: Map<String, Value>,
    links: Option<Value>,
}

impl Answer {
    /// An answer without a body.
    pub fn empty(status: u16, description: impl Into<String>) -> Self {
        Self { status, description: description.into(), content: Vec::new(), headers: Map::new(), links: None }
    }

    /// An answer with `content`.
    pub fn with(status: u16, description: impl Into<String>, content: Content) -> Self {
        Self { content: vec![content], ..Self::empty(status, description) }
    }

    /// A JSON answer of type `T`.
    pub fn json<T: JsonSchema>(status: u16, description: impl Into<String>) -> Self {
        Self::with(status, description, Content::json::<T>())
    }

    /// An error, as every error is: the runtime's [`ApiError`].
    pub fn error(status: u16, description: impl Into<String>) -> Self {
        Self::json::<ApiError>(status, description)
    }

    /// `413`: the body is larger than `limit` (the message names the limit).
    pub fn too_large(limit: impl std::fmt::Display) -> Self {
        Self::error(413, format!("The body is larger than {limit} (the message names the limit)"))
    }

    /// `413` of a JSON route: the body is larger than [`JSON_BODY_BYTES`].
    pub fn too_large_json() -> Self {
        Self::too_large(format!("{JSON_BODY_BYTES} bytes"))
    }

    /// `503` of a route that takes only so many requests at once (`limit` says which), with
    /// the `Retry-After` it sends.
    pub fn busy(limit: &str) -> Self {
        Self::error(503, format!("Busy: {limit}; try again after Retry-After")).header(
            "Retry-After",
            json!({ "description": "Seconds to wait before trying again", "schema": { "type": "integer", "minimum": 1 } }),
        )
    }

    /// The same answer with header `name` as `header` (an OpenAPI header object).
    pub fn header(mut self, name: &str, header: Value) -> Self {
        self.headers.insert(name.to_owned(), header);
        self
    }

    /// The same answer with `links` (an OpenAPI links object).
    pub fn links(self, links: Value) -> Self {
        Self { links: Some(links), ..self }
    }

    fn render(&self, generator: &mut SchemaGenerator) -> Value {
        let mut answer = json!({ "description": self.description });
        if !self.content.is_empty() {
            answer["content"] = render_contents(&self.content, generator);
        }
        if !self.headers.is_empty() {
            answer["headers"] = Value::Object(self.headers.clone());
        }
        if let Some(links) = &self.links {
            answer["links"] = links.clone();
        }
        answer
    }
}

/// A parameter in the path.
pub fn path_param(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": schema })
}

/// The `{id}` of a task or a job (`what` says which).
pub fn id_param(what: &str) -> Value {
    path_param("id", what, json!({ "type": "string", "pattern": ID_PATTERN }))
}

/// An optional query parameter.
pub fn query(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema })
}

/// One operation: the method and path it is served at, the scope it needs, and what the
/// document says of it.
#[derive(Clone)]
pub struct Operation {
    /// Its method.
    pub method: Method,
    /// Its path, as axum routes it (and OpenAPI writes it): `/v1/tasks/{id}`.
    pub path: &'static str,
    /// The scope a caller needs.
    pub scope: Scope,
    /// Its `operationId`.
    pub id: &'static str,
    summary: String,
    description: Option<String>,
    parameters: Vec<Value>,
    body: Option<(bool, Vec<Content>)>,
    answers: Vec<Answer>,
}

impl Operation {
    /// `method path`, needing `scope`, named `id`, summed up by `summary`.
    pub fn new(method: Method, path: &'static str, scope: Scope, id: &'static str, summary: impl Into<String>) -> Self {
        let summary = summary.into();
        Self {
            method,
            path,
            scope,
            id,
            summary,
            description: None,
            parameters: Vec::new(),
            body: None,
            answers: Vec::new(),
        }
    }

    /// A `GET`.
    pub fn get(path: &'static str, scope: Scope, id: &'static str, summary: impl Into<String>) -> Self {
        Self::new(Method::GET, path, scope, id, summary)
    }

    /// A `POST`.
    pub fn post(path: &'static str, scope: Scope, id: &'static str, summary: impl Into<String>) -> Self {
        Self::new(Method::POST, path, scope, id, summary)
    }

    /// A `PUT`.
    pub fn put(path: &'static str, scope: Scope, id: &'static str, summary: impl Into<String>) -> Self {
        Self::new(Method::PUT, path, scope, id, summary)
    }

    /// A `DELETE`.
    pub fn delete(path: &'static str, scope: Scope, id: &'static str, summary: impl Into<String>) -> Self {
        Self::new(Method::DELETE, path, scope, id, summary)
    }

    /// The same operation with a longer `description`.
    pub fn describe(self, description: impl Into<String>) -> Self {
        Self { description: Some(description.into()), ..self }
    }

    /// The same operation with one more parameter (see [`path_param`], [`query`]).
    pub fn param(mut self, parameter: Value) -> Self {
        self.parameters.push(parameter);
        self
    }

    /// The same operation with a request body of `content`, `required` or not.
    pub fn body(self, required: bool, content: Vec<Content>) -> Self {
        Self { body: Some((required, content)), ..self }
    }

    /// The same operation with `answer`, in place of one of the same status.
    pub fn answer(mut self, answer: Answer) -> Self {
        self.answers.retain(|a| a.status != answer.status);
        self.answers.push(answer);
        self
    }

    /// The same operation with `answer`, unless it has one of that status.
    pub fn answer_unless_given(self, answer: Answer) -> Self {
        if self.answers.iter().any(|a| a.status == answer.status) { self } else { self.answer(answer) }
    }

    /// The same operation answering `status` with a JSON `T`.
    pub fn ok<T: JsonSchema>(self, status: u16, description: &str) -> Self {
        self.answer(Answer::json::<T>(status, description))
    }

    /// The same operation answering `status` with an error.
    pub fn error(self, status: u16, description: &str) -> Self {
        self.answer(Answer::error(status, description))
    }

    /// Its path item entry: its method in lower case, and its OpenAPI operation object.
    pub fn render(&self, generator: &mut SchemaGenerator) -> (String, Value) {
        let mut operation = json!({ "operationId": self.id, "summary": self.summary });
        if let Some(description) = &self.description {
            operation["description"] = json!(description);
        }
        if !self.parameters.is_empty() {
            operation["parameters"] = json!(self.parameters);
        }
        if let Some((required, content)) = &self.body {
            operation["requestBody"] = json!({ "required": required, "content": render_contents(content, generator) });
        }
        let answers = self.answers.iter().map(|a| (a.status.to_string(), a.render(generator))).collect();
        operation["responses"] = Value::Object(answers);
        (self.method.as_str().to_ascii_lowercase(), operation)
    }
}

/// An [`Operation`] and the handler that serves it, behind its scope.
pub struct Route<S> {
    /// What is served, as the document shows it.
    pub operation: Operation,
    handler: MethodRouter<S>,
}

impl<S: Clone + Send + Sync + 'static> Route<S> {
    /// `operation`, served by `handler` to callers holding its scope.
    pub fn new<H: Handler<T, S>, T: 'static>(operation: Operation, handler: H) -> Self {
        let filter = MethodFilter::try_from(operation.method.clone()).expect("an operation's method is a standard one");
        Self { handler: require(operation.scope, on(filter, handler)), operation }
    }
}

/// A router serving `routes` (several on one path become one route with their methods).
pub fn mount<S: Clone + Send + Sync + 'static>(routes: Vec<Route<S>>) -> Router<S> {
    routes.into_iter().fold(Router::new(), |router, route| router.route(route.operation.path, route.handler))
}
