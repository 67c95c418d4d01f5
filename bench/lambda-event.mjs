// The API Gateway REST event both Lambda benchmarks invoke with (bench/lambda.ts, bench/lambda-cold.mjs).
export function restEvent(key) {
  return {
    httpMethod: "POST",
    path: "/v1/payments",
    headers: { "idempotency-key": key, "x-account": "acct", "content-type": "application/json" },
    multiValueHeaders: {},
    queryStringParameters: null,
    multiValueQueryStringParameters: null,
    body: '{"amount_cents":5000,"currency":"eur"}',
    isBase64Encoded: false,
    requestContext: {},
  };
}
