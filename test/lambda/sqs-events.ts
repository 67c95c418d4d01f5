/** SQS events as Lambda delivers them, typed by @types/aws-lambda. */
import { randomUUID } from "node:crypto";
import type { SQSEvent, SQSRecord } from "aws-lambda";

const QUEUE = "arn:aws:sqs:eu-west-1:123456789012:orders";

/** An SQS record as Lambda delivers it, typed by @types/aws-lambda. */
export function sqsRecord(
  body: object,
  options: { id?: string; group?: string; receives?: number } = {},
): SQSRecord {
  const fifo = options.group !== undefined;
  return {
    messageId: options.id ?? randomUUID(),
    receiptHandle: `AQEB${randomUUID()}`,
    body: JSON.stringify(body),
    attributes: {
      ApproximateReceiveCount: String(options.receives ?? 1),
      SentTimestamp: String(Date.now()),
      SenderId: "AIDAEXAMPLE",
      ApproximateFirstReceiveTimestamp: String(Date.now()),
      ...(fifo
        ? { MessageGroupId: options.group, MessageDeduplicationId: randomUUID(), SequenceNumber: "1" }
        : {}),
    },
    messageAttributes: {},
    md5OfBody: "0",
    eventSource: "aws:sqs",
    eventSourceARN: fifo ? `${QUEUE}.fifo` : QUEUE,
    awsRegion: "eu-west-1",
  };
}

/** The same records delivered again (SQS counts the receive). */
export const again = (event: SQSEvent): SQSEvent => ({
  Records: event.Records.map((r) => ({
    ...r,
    attributes: {
      ...r.attributes,
      ApproximateReceiveCount: String(Number(r.attributes.ApproximateReceiveCount) + 1),
    },
  })),
});
