/**
 * A URL as it may appear in a log line or an error message: the password replaced by `***`. A string
 * that does not parse as a URL is never echoed (it may be a password pasted in the wrong place).
 */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    return u.toString();
  } catch {
    return "(an unparsable URL)";
  }
}
