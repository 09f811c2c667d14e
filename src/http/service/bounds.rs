//! The bounds every step of a cached request puts on the inner service and
//! its response body, named once.

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::error::BoxError;

/// The inner service as the steps of a cached request need it: its future
/// and error cross into the flight's task. One name for the bound every
/// step repeats.
pub(crate) trait Origin<ReqB, ResB>:
    Service<Request<ReqB>, Response = Response<ResB>, Future: Send + 'static, Error: Send + 'static>
    + Send
    + 'static
{
}

impl<T, ReqB, ResB> Origin<ReqB, ResB> for T where
    T: Service<
            Request<ReqB>,
            Response = Response<ResB>,
            Future: Send + 'static,
            Error: Send + 'static,
        > + Send
        + 'static
{
}

/// An origin response body the cache can buffer, stream and share.
pub(crate) trait OriginBody:
    Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static
{
}

impl<T> OriginBody for T where T: Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static {}
