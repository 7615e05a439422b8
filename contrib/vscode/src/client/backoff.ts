/**
 * Reconnect pacing: exponential backoff with jitter, reset once a connection proves healthy.
 *
 * Pure: the random source is injected, so tests can pin the delays.
 */

export interface BackoffOptions {
  readonly initialMs: number;
  readonly maxMs: number;
  readonly factor: number;
  /** 0..1: each delay is drawn from [delay * (1 - jitter), delay]. */
  readonly jitter: number;
}

export const DEFAULT_BACKOFF: BackoffOptions = { initialMs: 250, maxMs: 10_000, factor: 2, jitter: 0.2 };

export class Backoff {
  private attempt = 0;

  constructor(
    private readonly options: BackoffOptions = DEFAULT_BACKOFF,
    private readonly random: () => number = Math.random,
  ) {}

  /** Failed attempts since the last reset. */
  get attempts(): number {
    return this.attempt;
  }

  /** The delay before the next attempt, in milliseconds; each call counts one attempt. */
  next(): number {
    const { initialMs, maxMs, factor, jitter } = this.options;
    const raw = Math.min(maxMs, initialMs * Math.pow(factor, this.attempt));
    this.attempt++;
    return Math.round(raw * (1 - jitter * this.random()));
  }

  reset(): void {
    this.attempt = 0;
  }
}
