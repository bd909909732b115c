package alloc

// The free chunks of a pool are kept in a B-tree ordered by (stream, size,
// address). The keys are copied into the nodes, so a search compares
// contiguous memory instead of chasing a pointer per level as a binary tree
// would: with thousands of cached blocks a binary tree is some twenty cache
// misses deep, this one three. The smallest key at or after (s, size, 0) is
// the best fit for a request of size bytes on stream s; the last key of each
// stream is that stream's largest free chunk.

const (
	btMinDegree = 16                  // every node but the root holds at least btMinDegree-1 keys
	btMaxItems  = 2*btMinDegree - 1   // and at most this many
	btMaxStream = Stream(^uintptr(0)) // the last possible stream
)

type btKey struct {
	stream Stream
	size   int
	ptr    uintptr
}

func (k btKey) less(o btKey) bool {
	if k.stream != o.stream {
		return k.stream < o.stream
	}
	if k.size != o.size {
		return k.size < o.size
	}
	return k.ptr < o.ptr
}

func keyOf(c *memChunk) btKey { return btKey{c.stream, c.size, c.ptr} }

// btItem names its chunk by slot, so that items hold no pointers and moving
// them around in a node is a plain memory move, free of write barriers.
type btItem struct {
	key  btKey
	slot uint32
}

type btNode struct {
	n     int
	items [btMaxItems]btItem
	kids  [btMaxItems + 1]*btNode // all nil in a leaf
}

func (x *btNode) leaf() bool { return x.kids[0] == nil }

// search returns the index of the first item of x not before k.
func (x *btNode) search(k btKey) int {
	lo, hi := 0, x.n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if x.items[m].key.less(k) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// freeTree is a B-tree of free chunks.
type freeTree struct {
	root *btNode
	n    int
}

// ceil returns the first item not before k.
func (t *freeTree) ceil(k btKey) (btItem, bool) {
	var best btItem
	found := false
	for x := t.root; x != nil; {
		i := x.search(k)
		if i < x.n {
			best, found = x.items[i], true
		}
		x = x.kids[i]
	}
	return best, found
}

// floorBefore returns the last item before k.
func (t *freeTree) floorBefore(k btKey) (btItem, bool) {
	var best btItem
	found := false
	for x := t.root; x != nil; {
		i := x.search(k)
		if i > 0 {
			best, found = x.items[i-1], true
		}
		x = x.kids[i]
	}
	return best, found
}

func (t *freeTree) last() (btItem, bool) {
	x := t.root
	if x == nil || x.n == 0 {
		return btItem{}, false
	}
	for !x.leaf() {
		x = x.kids[x.n]
	}
	return x.items[x.n-1], true
}

// find returns the best fit for size bytes on stream s in p: the smallest
// free chunk of s with at least size bytes, the lowest address among equals.
func (a *Allocator) find(p *blockPool, s Stream, size int) *memChunk {
	it, ok := p.tree.ceil(btKey{stream: s, size: size})
	if !ok || it.key.stream != s {
		return nil
	}
	return a.slots[it.slot]
}

// takeBestFit removes and returns the best fit for size bytes on stream s,
// or returns nil. When the whole tree is one leaf, as it is while a pool
// caches fewer than 32 free chunks, it searches once instead of twice.
func (a *Allocator) takeBestFit(p *blockPool, s Stream, size int) *memChunk {
	x := p.tree.root
	if x == nil || !x.leaf() {
		c := a.find(p, s, size)
		if c != nil {
			a.poolRemove(p, c)
		}
		return c
	}
	i := x.search(btKey{stream: s, size: size})
	if i == x.n || x.items[i].key.stream != s {
		return nil
	}
	c := a.slots[x.items[i].slot]
	if i < x.n-1 {
		copy(x.items[i:x.n-1], x.items[i+1:x.n])
	}
	x.n--
	x.items[x.n] = btItem{}
	p.tree.n--
	if c.isSplit() {
		bump(&a.stats.InactiveSplit, -c.size)
	}
	return c
}

// setItem puts it in place of item i of the leaf x and moves it left or
// right until the keys are in order again: a chunk split or merged changes
// its key a little, so it moves few places, if any.
func (x *btNode) setItem(i int, it btItem) {
	for i > 0 && it.key.less(x.items[i-1].key) {
		x.items[i] = x.items[i-1]
		i--
	}
	for i+1 < x.n && x.items[i+1].key.less(it.key) {
		x.items[i] = x.items[i+1]
		i++
	}
	x.items[i] = it
}

// replace swaps the item with key old, which must be in the tree, for it:
// in place when the tree is one leaf, else by a delete and an insert.
func (t *freeTree) replace(old btKey, it btItem) {
	if x := t.root; x != nil && x.leaf() {
		i := x.search(old)
		if i == x.n || x.items[i].key != old {
			panic("cuda: allocator corrupted: free chunk missing from its pool")
		}
		x.setItem(i, it)
		return
	}
	t.delete(old)
	t.insert(it)
}

// leafFit is Alloc's cache hit when p's tree is one leaf (fewer than 32
// free chunks cached): the best fit is found, split and its rest put in its
// place in one search of the leaf, instead of a removal and an insert. It
// returns the chunk to hand out, out of the tree, or nil, having changed
// nothing, when the tree is not a leaf or has no fit.
func (a *Allocator) leafFit(p *blockPool, s Stream, rounded int) *memChunk {
	x := p.tree.root
	if x == nil || !x.leaf() {
		return nil
	}
	i := x.search(btKey{stream: s, size: rounded})
	if i == x.n || x.items[i].key.stream != s {
		return nil
	}
	c := a.slots[x.items[i].slot]
	if c.isSplit() {
		bump(&a.stats.InactiveSplit, -c.size)
	}
	if r := a.split(p, c, rounded); r != nil {
		x.setItem(i, btItem{keyOf(r), r.slot})
		bump(&a.stats.InactiveSplit, r.size)
	} else {
		copy(x.items[i:x.n-1], x.items[i+1:x.n])
		x.n--
		x.items[x.n] = btItem{}
		p.tree.n--
	}
	return c
}

// largestFree is the size of the biggest chunk in p, 0 if none: the last
// chunk of each stream present, found in O(streams * log n).
func (p *blockPool) largestFree() int {
	best := 0
	k := btKey{}
	for {
		it, ok := p.tree.ceil(k)
		if !ok {
			return best
		}
		s := it.key.stream
		var last btItem
		if s == btMaxStream {
			last, _ = p.tree.last()
		} else {
			last, _ = p.tree.floorBefore(btKey{stream: s + 1})
		}
		best = max(best, last.key.size)
		if s == btMaxStream {
			return best
		}
		k = btKey{stream: s + 1}
	}
}

// poolInsert caches the free chunk c in p.
func (a *Allocator) poolInsert(p *blockPool, c *memChunk) {
	p.tree.insert(btItem{keyOf(c), c.slot})
	if c.isSplit() {
		bump(&a.stats.InactiveSplit, c.size)
	}
}

// poolRemove takes the cached chunk c out of p.
func (a *Allocator) poolRemove(p *blockPool, c *memChunk) {
	p.tree.delete(keyOf(c))
	if c.isSplit() {
		bump(&a.stats.InactiveSplit, -c.size)
	}
}

func (t *freeTree) insert(it btItem) {
	// Fast path: a pool caching fewer than btMaxItems chunks is one leaf.
	if x := t.root; x != nil && x.n < btMaxItems && x.leaf() {
		i := x.search(it.key)
		for j := x.n; j > i; j-- {
			x.items[j] = x.items[j-1]
		}
		x.items[i] = it
		x.n++
		t.n++
		return
	}
	if t.root == nil {
		t.root = new(btNode)
	}
	if t.root.n == btMaxItems {
		r := new(btNode)
		r.kids[0] = t.root
		r.splitChild(0)
		t.root = r
	}
	x := t.root
	for {
		i := x.search(it.key)
		if x.leaf() {
			// Items hold a pointer, so even an empty copy is a runtime
			// call; the hot path mostly appends to or empties a leaf.
			if i < x.n {
				copy(x.items[i+1:x.n+1], x.items[i:x.n])
			}
			x.items[i] = it
			x.n++
			t.n++
			return
		}
		if x.kids[i].n == btMaxItems {
			x.splitChild(i)
			if x.items[i].key.less(it.key) {
				i++
			}
		}
		x = x.kids[i]
	}
}

// splitChild splits the full child i of x around its median, which moves up
// into x. x is not full.
func (x *btNode) splitChild(i int) {
	const t = btMinDegree
	y := x.kids[i]
	z := new(btNode)
	z.n = t - 1
	copy(z.items[:t-1], y.items[t:])
	if !y.leaf() {
		copy(z.kids[:t], y.kids[t:])
		clear(y.kids[t:])
	}
	mid := y.items[t-1]
	clear(y.items[t-1:])
	y.n = t - 1
	copy(x.kids[i+2:x.n+2], x.kids[i+1:x.n+1])
	x.kids[i+1] = z
	copy(x.items[i+1:x.n+1], x.items[i:x.n])
	x.items[i] = mid
	x.n++
}

// delete removes the item with key k, which must be in the tree. It goes
// down once, topping up every node it enters to at least btMinDegree keys
// so that removing one never leaves a node short.
func (t *freeTree) delete(k btKey) {
	x := t.root
	if x != nil && x.leaf() { // fast path: the tree is one leaf
		i := x.search(k)
		if i == x.n || x.items[i].key != k {
			panic("cuda: allocator corrupted: free chunk missing from its pool")
		}
		x.n--
		for ; i < x.n; i++ {
			x.items[i] = x.items[i+1]
		}
		x.items[x.n] = btItem{}
		t.n--
		return
	}
	for {
		if x == nil {
			panic("cuda: allocator corrupted: free chunk missing from its pool")
		}
		i := x.search(k)
		if i < x.n && x.items[i].key == k {
			if x.leaf() {
				if i < x.n-1 {
					copy(x.items[i:x.n-1], x.items[i+1:x.n])
				}
				x.n--
				x.items[x.n] = btItem{}
				break
			}
			switch {
			case x.kids[i].n >= btMinDegree:
				// Replace with the predecessor and delete that instead.
				pred := x.kids[i]
				for !pred.leaf() {
					pred = pred.kids[pred.n]
				}
				x.items[i] = pred.items[pred.n-1]
				k = x.items[i].key
				x = x.kids[i]
			case x.kids[i+1].n >= btMinDegree:
				succ := x.kids[i+1]
				for !succ.leaf() {
					succ = succ.kids[0]
				}
				x.items[i] = succ.items[0]
				k = x.items[i].key
				x = x.kids[i+1]
			default:
				x.merge(i)
				x = x.kids[i]
			}
			continue
		}
		if x.leaf() {
			panic("cuda: allocator corrupted: free chunk missing from its pool")
		}
		if x.kids[i].n < btMinDegree {
			i = x.fill(i)
		}
		x = x.kids[i]
	}
	t.n--
	if r := t.root; r.n == 0 && !r.leaf() {
		t.root = r.kids[0]
	}
}

// fill gives child i of x at least btMinDegree keys, borrowing from a
// sibling or merging with one, and returns the index of the child that now
// covers the keys child i covered.
func (x *btNode) fill(i int) int {
	switch {
	case i > 0 && x.kids[i-1].n >= btMinDegree:
		c, l := x.kids[i], x.kids[i-1]
		copy(c.items[1:c.n+1], c.items[:c.n])
		c.items[0] = x.items[i-1]
		if !c.leaf() {
			copy(c.kids[1:c.n+2], c.kids[:c.n+1])
			c.kids[0] = l.kids[l.n]
			l.kids[l.n] = nil
		}
		x.items[i-1] = l.items[l.n-1]
		l.items[l.n-1] = btItem{}
		l.n--
		c.n++
		return i
	case i < x.n && x.kids[i+1].n >= btMinDegree:
		c, r := x.kids[i], x.kids[i+1]
		c.items[c.n] = x.items[i]
		if !c.leaf() {
			c.kids[c.n+1] = r.kids[0]
			copy(r.kids[:r.n], r.kids[1:r.n+1])
			r.kids[r.n] = nil
		}
		x.items[i] = r.items[0]
		copy(r.items[:r.n-1], r.items[1:r.n])
		r.items[r.n-1] = btItem{}
		r.n--
		c.n++
		return i
	case i < x.n:
		x.merge(i)
		return i
	default:
		x.merge(i - 1)
		return i - 1
	}
}

// merge joins child i, item i and child i+1 of x into child i.
func (x *btNode) merge(i int) {
	c, r := x.kids[i], x.kids[i+1]
	c.items[c.n] = x.items[i]
	copy(c.items[c.n+1:], r.items[:r.n])
	if !c.leaf() {
		copy(c.kids[c.n+1:], r.kids[:r.n+1])
	}
	c.n += r.n + 1
	copy(x.items[i:x.n-1], x.items[i+1:x.n])
	copy(x.kids[i+1:x.n], x.kids[i+2:x.n+1])
	x.n--
	x.items[x.n] = btItem{}
	x.kids[x.n+1] = nil
}
