package storage

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// verifyFile checks the page structure of the bbolt file at path before
// bbolt reads it: that every page the tree and the freelist name lies
// below the high water mark, that the tree names each page once (no
// cycles) and none that is free (bbolt would hand it out again, and its
// next write could make a cycle), that each carries its own id and a type
// that fits, and that every element, key and value lies inside its page. bbolt trusts all of that: it has no checksum on data
// pages, and a damaged page id, count or length sends it past its memory
// map (a fault), into a loop (a stack overflow or an exhausted heap) or
// into a freelist of billions of pages, none of which a recover catches.
//
// It reads with plain reads, never through the map, and visits each page
// once. pageSize is the size bbolt found in the meta page. The layout is
// bbolt's file format version 2, in the machine's byte order as bbolt
// writes it.
func verifyFile(path string, pageSize int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	v := &verifier{r: f, size: fi.Size(), ps: uint64(pageSize), seen: map[uint64]bool{}, free: map[uint64]bool{}}
	return v.run()
}

// bbolt's file format: page header, element and meta layouts.
const (
	pageHeaderSize = 16 // id u64, flags u16, count u16, overflow u32
	elementSize    = 16 // branch: pos, ksize u32, pgid u64; leaf: flags, pos, ksize, vsize u32
	bucketHeader   = 16 // a nested bucket's value: root pgid u64, sequence u64

	pageBranch   = 0x01
	pageLeaf     = 0x02
	pageFreelist = 0x10
	elemBucket   = 0x01 // leaf element flag: the value is a nested bucket

	boltMagic     = 0xED0CDAED
	boltVersion   = 2
	noFreelist    = ^uint64(0)
	maxNestDepth  = 16 // nested buckets; fieldgate's own go two deep (outbox, then a bridge's)
	metaSumOffset = 56 // the meta's checksum covers its bytes before this
)

// native is the byte order bbolt writes its pages in.
var native = binary.NativeEndian

type verifier struct {
	r    io.ReaderAt
	size int64
	ps   uint64
	hwm  uint64 // pages in use: the meta's high water mark
	seen map[uint64]bool
	free map[uint64]bool
	bufs [maxNestDepth + 1][]byte // one page buffer per nesting depth
}

func (v *verifier) run() error {
	root, freelist, err := v.meta()
	if err != nil {
		return err
	}
	if v.hwm > uint64(v.size)/v.ps {
		return fmt.Errorf("truncated to %d bytes, its meta page counts %d pages of %d", v.size, v.hwm, v.ps)
	}
	if freelist != noFreelist {
		if err := v.freelist(freelist); err != nil {
			return err
		}
	}
	return v.tree(root, 0)
}

// meta finds the meta page bbolt uses, the valid one with the higher
// transaction id, and returns its root page and freelist page.
func (v *verifier) meta() (root, freelist uint64, err error) {
	var best []byte
	for i := range uint64(2) {
		b := make([]byte, pageHeaderSize+64)
		if _, err := v.r.ReadAt(b, int64(i*v.ps)); err != nil {
			continue
		}
		m := b[pageHeaderSize:]
		h := fnv.New64a()
		h.Write(m[:metaSumOffset])
		if native.Uint32(m) != boltMagic || native.Uint32(m[4:]) != boltVersion || native.Uint64(m[metaSumOffset:]) != h.Sum64() {
			continue
		}
		if best == nil || native.Uint64(m[48:]) > native.Uint64(best[48:]) {
			best = m
		}
	}
	if best == nil {
		return 0, 0, fmt.Errorf("no valid meta page")
	}
	v.hwm = native.Uint64(best[40:])
	return native.Uint64(best[16:]), native.Uint64(best[32:]), nil
}

// page reads page id with its overflow pages, once, into the buffer of
// depth: a tree is done with one page before it reads the next, and the
// trees nested in it use the next depth's.
func (v *verifier) page(id uint64, what string, depth int) ([]byte, error) {
	if id < 2 || id >= v.hwm {
		return nil, fmt.Errorf("%s names page %d, outside 2 to %d", what, id, v.hwm-1)
	}
	hdr := make([]byte, pageHeaderSize)
	if _, err := v.r.ReadAt(hdr, int64(id*v.ps)); err != nil {
		return nil, fmt.Errorf("page %d: %w", id, err)
	}
	if got := native.Uint64(hdr); got != id {
		return nil, fmt.Errorf("page %d holds the header of page %d", id, got)
	}
	n := 1 + uint64(native.Uint32(hdr[12:]))
	if id+n > v.hwm {
		return nil, fmt.Errorf("page %d claims %d overflow pages, past the end of the data", id, n-1)
	}
	for i := range n {
		switch {
		case v.seen[id+i]:
			return nil, fmt.Errorf("%s names page %d, which is in use already", what, id+i)
		case v.free[id+i]:
			return nil, fmt.Errorf("%s names page %d, which the freelist lists as free", what, id+i)
		}
		v.seen[id+i] = true
	}
	b := v.bufs[depth]
	if uint64(cap(b)) < n*v.ps {
		b = make([]byte, n*v.ps)
		v.bufs[depth] = b
	}
	b = b[:n*v.ps]
	if _, err := v.r.ReadAt(b, int64(id*v.ps)); err != nil {
		return nil, fmt.Errorf("page %d: %w", id, err)
	}
	return b, nil
}

func (v *verifier) freelist(id uint64) error {
	p, err := v.page(id, "the meta page's freelist", 0)
	if err != nil {
		return err
	}
	if native.Uint16(p[8:]) != pageFreelist {
		return fmt.Errorf("freelist page %d has type %#x", id, native.Uint16(p[8:]))
	}
	start, count := uint64(pageHeaderSize), uint64(native.Uint16(p[10:]))
	if count == 0xFFFF { // the real count is the first element
		count, start = native.Uint64(p[pageHeaderSize:]), start+8
	}
	if count > (uint64(len(p))-start)/8 {
		return fmt.Errorf("freelist page %d claims %d ids, more than it holds", id, count)
	}
	for i := range count {
		free := native.Uint64(p[start+8*i:])
		if free < 2 || free >= v.hwm {
			return fmt.Errorf("freelist page %d names page %d, outside 2 to %d", id, free, v.hwm-1)
		}
		if v.seen[free] {
			return fmt.Errorf("freelist page %d names itself free", id)
		}
		v.free[free] = true
	}
	return nil
}

// tree checks the pages of a bucket, starting at its root page.
func (v *verifier) tree(root uint64, depth int) error {
	stack := []uint64{root}
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		p, err := v.page(id, "the tree", depth)
		if err != nil {
			return err
		}
		switch flags := native.Uint16(p[8:]); flags {
		case pageBranch:
			count := uint64(native.Uint16(p[10:]))
			if count == 0 || pageHeaderSize+count*elementSize > uint64(len(p)) {
				return fmt.Errorf("branch page %d claims %d elements", id, count)
			}
			for i := range count {
				e := pageHeaderSize + i*elementSize
				if e+uint64(native.Uint32(p[e:]))+uint64(native.Uint32(p[e+4:])) > uint64(len(p)) {
					return fmt.Errorf("branch page %d: key %d lies outside the page", id, i)
				}
				stack = append(stack, native.Uint64(p[e+8:]))
			}
		case pageLeaf:
			if err := v.leaf(p, id, depth); err != nil {
				return err
			}
		default:
			return fmt.Errorf("page %d in the tree has type %#x", id, flags)
		}
	}
	return nil
}

// leaf checks a leaf page, which for an inline bucket is part of a value.
func (v *verifier) leaf(p []byte, id uint64, depth int) error {
	if uint64(len(p)) < pageHeaderSize || native.Uint16(p[8:]) != pageLeaf {
		return fmt.Errorf("leaf page %d: not a leaf page", id)
	}
	count := uint64(native.Uint16(p[10:]))
	if pageHeaderSize+count*elementSize > uint64(len(p)) {
		return fmt.Errorf("leaf page %d claims %d elements", id, count)
	}
	for i := range count {
		e := pageHeaderSize + i*elementSize
		flags, pos, ksize, vsize := native.Uint32(p[e:]), uint64(native.Uint32(p[e+4:])), uint64(native.Uint32(p[e+8:])), uint64(native.Uint32(p[e+12:]))
		if e+pos+ksize+vsize > uint64(len(p)) {
			return fmt.Errorf("leaf page %d: record %d lies outside the page", id, i)
		}
		if flags&elemBucket == 0 {
			continue
		}
		if depth >= maxNestDepth {
			return fmt.Errorf("leaf page %d: buckets nested more than %d deep", id, maxNestDepth)
		}
		val := p[e+pos+ksize : e+pos+ksize+vsize]
		if len(val) < bucketHeader {
			return fmt.Errorf("leaf page %d: record %d is a bucket of %d bytes", id, i, len(val))
		}
		var err error
		if root := native.Uint64(val); root == 0 {
			err = v.leaf(val[bucketHeader:], id, depth+1)
		} else {
			err = v.tree(root, depth+1)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
