//! The node's batch endpoints (`docs/api.md`, "Batches"): `NodeClient::mirrored_batch`,
//! `ack_batch`, `handoff_batch`, `reject_batch` and `report_batch`, each one request for many
//! items of one kind.
//!
//! A batch the hub took answers one result per item, in request order, each what the single
//! endpoint would have answered for it: here a `Result` per item, its refusal a
//! `ClientError::Api` exactly as the single call's. What concerns the whole request (an
//! outage, a revoked certificate, a newer session, a bound) is the call's own `Err`; a hub that
//! predates batches answers the whole request 404 (`ClientError::route_unknown`).
//!
//! Each batch is sent once, like its single calls: replaying one is as safe as replaying each
//! item, but the caller decides (a node retries only the items still without an answer).

use crate::client::NodeClient;
use crate::error::{ApiError, ClientError};
use crate::limits::REQUEST_TIMEOUT;
use baton_shared::error::ErrorCode;
use baton_shared::wire::{
    BatchHolderRequest, BatchRejectRequest, BatchReportRequest, BatchReportResponse, BatchTransitionResponse,
    HolderItem, ItemResult, RejectItem, ReportRequest, ReportResponse, TransitionResponse,
};

/// The answer of one item of a batch: its body, or its refusal as the single endpoint's.
pub type ItemAnswer<T> = Result<T, ClientError>;

impl NodeClient {
    /// `POST /v1/batch/mirrored`: `mirrored` for each of `items` (at most
    /// `baton_shared::limits::BATCH_ITEMS_MAX`); one answer per item, in order.
    pub async fn mirrored_batch(
        &self,
        items: Vec<HolderItem>,
    ) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        self.holder_batch("/v1/batch/mirrored", items).await
    }

    /// `POST /v1/batch/ack`: `ack` for each of `items`, as `mirrored_batch`.
    pub async fn ack_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        self.holder_batch("/v1/batch/ack", items).await
    }

    /// `POST /v1/batch/handoff`: the whole handoff for each of `items`, `mirrored` then `ack`
    /// in one request and one hub transaction (claimed or mirrored → delivered), as
    /// `mirrored_batch`; each answer is the `ack`'s. A hub that predates it answers 404
    /// (`ClientError::route_unknown`): then `mirrored_batch` and `ack_batch` do the same in two.
    pub async fn handoff_batch(
        &self,
        items: Vec<HolderItem>,
    ) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        self.holder_batch("/v1/batch/handoff", items).await
    }

    /// `POST /v1/batch/reject`: `reject` for each of `items` (each with its reason), as
    /// `mirrored_batch`.
    pub async fn reject_batch(
        &self,
        items: Vec<RejectItem>,
    ) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        let n = items.len();
        let body = BatchRejectRequest { instance_id: self.instance_id().to_string(), deliveries: items };
        let r: BatchTransitionResponse = self.post("/v1/batch/reject", &body, REQUEST_TIMEOUT).await?;
        per_item("/v1/batch/reject", n, r.results)
    }

    /// `POST /v1/batch/reports`: many attempt reports (at most `BATCH_ITEMS_MAX`, and
    /// `BATCH_BYTES_MAX` bytes in all); one answer per report, in order. Sent once: the caller
    /// resends what had no answer, under the same report ids.
    pub async fn report_batch(
        &self,
        reports: Vec<ReportRequest>,
    ) -> Result<Vec<ItemAnswer<ReportResponse>>, ClientError> {
        let n = reports.len();
        let body = BatchReportRequest { reports };
        let r: BatchReportResponse = self.post("/v1/batch/reports", &body, REQUEST_TIMEOUT).await?;
        per_item("/v1/batch/reports", n, r.results)
    }

    async fn holder_batch(
        &self,
        route: &'static str,
        deliveries: Vec<HolderItem>,
    ) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        let n = deliveries.len();
        let body = BatchHolderRequest { instance_id: self.instance_id().to_string(), deliveries };
        let r: BatchTransitionResponse = self.post(route, &body, REQUEST_TIMEOUT).await?;
        per_item(route, n, r.results)
    }
}

/// The typed answers of a batch of `sent` items: one per item, or `BadAnswer` when the hub's
/// count differs (an answer that cannot be matched to the items is no answer).
fn per_item<T>(route: &str, sent: usize, results: Vec<ItemResult<T>>) -> Result<Vec<ItemAnswer<T>>, ClientError> {
    if results.len() != sent {
        let detail = format!("{route}: {} results for {sent} items", results.len());
        return Err(ClientError::BadAnswer { status: 200, detail });
    }
    Ok(results.into_iter().map(item_answer).collect())
}

/// One item of a batch answer as the single endpoint's answer would have been: its body, or
/// `ClientError::Api` with the item's status and error.
pub(crate) fn item_answer<T>(item: ItemResult<T>) -> ItemAnswer<T> {
    let status = item.status;
    item.into_result().map_err(|e| {
        ClientError::Api(ApiError { status, code: ErrorCode::parse(&e.code), code_text: e.code, message: e.message })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_shared::states::DeliveryState;
    use baton_shared::wire::{ErrorBody, ItemOutcome};

    fn moved(id: &str) -> TransitionResponse {
        serde_json::from_value(serde_json::json!({
            "delivery_id": id, "state": "mirrored", "changed": true
        }))
        .unwrap()
    }

    fn refused(status: u16, code: &str) -> ItemResult<TransitionResponse> {
        ItemResult { status, outcome: ItemOutcome::Error(ErrorBody { code: code.into(), message: "m".into() }) }
    }

    #[test]
    fn each_item_answers_as_its_single_call_would() {
        let results = vec![
            ItemResult { status: 200, outcome: ItemOutcome::Ok(moved("d1")) },
            refused(409, "stale_claim"),
            refused(404, "not_found"),
        ];
        let answers = per_item("/v1/batch/mirrored", 3, results).unwrap();
        assert_eq!(answers[0].as_ref().unwrap().state, DeliveryState::Mirrored);
        let stale = answers[1].as_ref().unwrap_err();
        assert_eq!((stale.code(), stale.api().map(|a| a.status)), (Some(ErrorCode::StaleClaim), Some(409)));
        assert!(!stale.is_transient() && !stale.answer_lost());
        // An item's 404 is that delivery unknown, which `route_unknown` says only of a whole
        // request; the caller asks it only of the batch call's own error.
        assert_eq!(answers[2].as_ref().unwrap_err().code(), Some(ErrorCode::NotFound));
    }

    #[test]
    fn an_answer_with_another_count_of_results_is_no_answer() {
        let e = per_item("/v1/batch/ack", 2, vec![refused(409, "stale_claim")]).unwrap_err();
        assert!(matches!(e, ClientError::BadAnswer { .. }) && e.answer_lost(), "{e}");
        assert!(e.to_string().contains("1 results for 2 items"), "{e}");
    }

    #[test]
    fn an_item_code_from_a_newer_hub_keeps_its_text() {
        let e = item_answer(refused(409, "a_code_from_the_future")).unwrap_err();
        let api = e.api().unwrap();
        assert_eq!((api.code, api.code_text.as_str()), (None, "a_code_from_the_future"));
    }
}
