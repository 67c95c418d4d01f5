/**
 * A promise and the function that settles it, for tests that hold a handler at a chosen point:
 * `const [gate, release] = latch();` then `await gate` inside the handler and `release()` from the test.
 */
export function latch(): [Promise<void>, () => void] {
  let open!: () => void;
  const settled = new Promise<void>((resolve) => {
    open = resolve;
  });
  return [settled, open];
}
