/**
 * Gap-free agent output: chunks are numbered from 1 per agent, so a follower keeps the last
 * seq it showed, appends the next one from events, and fetches `output?since=` whenever a
 * chunk is missing (after a reconnect, or when it started late). Nothing is shown twice.
 */

export interface Chunk {
  readonly seq: number;
  readonly chunk: string;
}

export interface OutputPage {
  readonly seq: number;
  readonly chunks: readonly Chunk[];
  readonly more: boolean;
}

export type FetchPage = (since: number) => Promise<OutputPage>;

export class OutputFollower {
  /** The last seq written out. */
  shown = 0;
  private fetching: Promise<void> | undefined;
  private wanted = false;

  constructor(
    private readonly fetchPage: FetchPage,
    private readonly write: (text: string) => void,
  ) {}

  /** A live `agent.output` chunk: written at once when it is the next one, else triggers a catch-up. */
  offer(chunk: Chunk): Promise<void> {
    if (chunk.seq <= this.shown) return Promise.resolve();
    if (chunk.seq === this.shown + 1 && !this.fetching) {
      this.shown = chunk.seq;
      this.write(chunk.chunk);
      return Promise.resolve();
    }
    return this.catchUp();
  }

  /** Fetch everything after `shown`, page by page; concurrent calls share one pass. */
  catchUp(): Promise<void> {
    if (this.fetching) {
      this.wanted = true;
      return this.fetching;
    }
    const run = async (): Promise<void> => {
      try {
        do {
          this.wanted = false;
          for (;;) {
            const page = await this.fetchPage(this.shown);
            for (const c of page.chunks) {
              if (c.seq <= this.shown) continue;
              this.shown = c.seq;
              this.write(c.chunk);
            }
            if (!page.more || page.chunks.length === 0) break;
          }
        } while (this.wanted);
      } finally {
        this.fetching = undefined;
      }
    };
    this.fetching = run();
    return this.fetching;
  }
}
