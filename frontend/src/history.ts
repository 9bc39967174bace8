// The undo stack: snapshots of the definition, one per change set, so undo and redo are exact and a
// delete can always be undone.

export class History<T> {
  private past: T[] = [];
  private future: T[] = [];
  private presentValue: T;
  readonly limit: number;

  constructor(initial: T, limit = 200) {
    this.presentValue = initial;
    this.limit = limit;
  }

  get present(): T {
    return this.presentValue;
  }

  get canUndo(): boolean {
    return this.past.length > 0;
  }

  get canRedo(): boolean {
    return this.future.length > 0;
  }

  /** Record a new state; an equal state is not a change. Clears the redo branch. */
  push(next: T, equals: (a: T, b: T) => boolean = (a, b) => JSON.stringify(a) === JSON.stringify(b)): boolean {
    if (equals(this.presentValue, next)) return false;
    this.past.push(this.presentValue);
    if (this.past.length > this.limit) this.past.shift();
    this.presentValue = next;
    this.future = [];
    return true;
  }

  undo(): T | undefined {
    const previous = this.past.pop();
    if (previous === undefined) return undefined;
    this.future.push(this.presentValue);
    this.presentValue = previous;
    return previous;
  }

  redo(): T | undefined {
    const next = this.future.pop();
    if (next === undefined) return undefined;
    this.past.push(this.presentValue);
    this.presentValue = next;
    return next;
  }

  /** Start over from a state (a workflow loaded or reloaded from the server). */
  reset(value: T): void {
    this.past = [];
    this.future = [];
    this.presentValue = value;
  }
}
