/**
 * An SQS message as the inbox's `Delivery`. Which id a copy is deduplicated on: the `idem-message-id`
 * message attribute when the producer set one (an outbox event keeps its id in every copy published),
 * else SQS's own message id, which every redelivery of one sent message keeps (two sends of the same
 * event get two; only the attribute joins them).
 */
import { type Delivery, HEADERS } from "./types.ts";

/** The message attribute that carries the producer's message id (the outbox event id). */
export const SQS_MESSAGE_ID_ATTRIBUTE = "idem-message-id";

/** An SQS record as Lambda hands it (`SQSRecord` of `@types/aws-lambda`), the fields idem reads. */
export interface SqsRecordLike {
  messageId: string;
  body: string;
  attributes?:
    | { ApproximateReceiveCount?: string | undefined; MessageGroupId?: string | undefined }
    | undefined;
  messageAttributes?:
    | Record<string, { stringValue?: string | undefined; dataType?: string | undefined } | undefined>
    | undefined;
  eventSourceARN?: string | undefined;
}

/** The record as a `Delivery` (string message attributes become its headers). */
export function deliveryOfSqsRecord<R extends SqsRecordLike>(
  record: R,
  messageId?: (record: R) => string,
): Delivery {
  const headers: Record<string, string> = {};
  for (const [name, attribute] of Object.entries(record.messageAttributes ?? {})) {
    if (attribute?.stringValue !== undefined) headers[name] = attribute.stringValue;
  }
  const arn = record.eventSourceARN ?? "";
  return {
    id: messageId ? messageId(record) : (headers[SQS_MESSAGE_ID_ATTRIBUTE] ?? record.messageId),
    topic: arn.slice(arn.lastIndexOf(":") + 1),
    type: headers[HEADERS.type] ?? "",
    body: record.body,
    headers,
    redelivered: Number(record.attributes?.ApproximateReceiveCount ?? 1) > 1,
  };
}
