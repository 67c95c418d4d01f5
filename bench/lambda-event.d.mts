import type { APIGatewayProxyEvent } from "aws-lambda";
export declare function restEvent(key: string): APIGatewayProxyEvent;
